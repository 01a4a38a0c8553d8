//go:build !linux

package agent

import "errors"

func unmapExecutable() (int64, error, error) {
	err := errors.New("unmap the executable: only on Linux")
	return 0, err, err
}

func majorFaults() int64 { return 0 }
