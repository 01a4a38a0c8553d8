//go:build linux && !(amd64 || arm64 || riscv64 || loong64 || 386 || arm)

package agent

import "errors"

func pageByPage([]addrRange) error {
	return errors.New("userfaultfd: not on this architecture")
}
