//go:build !linux

package agent

import "errors"

func unmapExecutable() (int64, error) {
	return 0, errors.New("unmap the executable: only on Linux")
}

func majorFaults() int64 { return 0 }
