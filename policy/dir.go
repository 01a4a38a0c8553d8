package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// DirProblem says why path can never be made a directory, or returns nil:
// a component of it is a loop of symbolic links, a symbolic link to
// nothing, or not a directory. os.MkdirAll says only "file exists" for the
// first two; a problem of permissions or space is left to the error of
// the operation itself.
func DirProblem(path string) error {
	loop := ""
	for p := filepath.Clean(path); ; {
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, syscall.ELOOP):
			loop = p // the outermost looping component names the loop
		case loop != "":
			return fmt.Errorf("%s is a loop of symbolic links (%w)", loop, syscall.ELOOP)
		case err == nil && !fi.IsDir():
			return fmt.Errorf("%s is not a directory", p)
		case err == nil:
			return nil
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
			if target, lerr := os.Readlink(p); lerr == nil {
				return fmt.Errorf("%s is a symbolic link to %s, which does not exist", p, target)
			}
		default:
			return nil
		}
		parent := filepath.Dir(p)
		if parent == p {
			if loop != "" {
				return fmt.Errorf("%s is a loop of symbolic links (%w)", loop, syscall.ELOOP)
			}
			return nil
		}
		p = parent
	}
}
