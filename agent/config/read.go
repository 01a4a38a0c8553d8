package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxFileSize caps the config file: a bigger one is refused before it is
// parsed (the parser's cost grows faster than the file).
const MaxFileSize = 64 << 20

// ErrEmpty is returned for an empty file where content is required.
var ErrEmpty = errors.New("the file is empty")

// ReadRegular reads the regular file at path, refusing anything else (a
// FIFO or device would block or never end) and files over max bytes. It
// never blocks on open: the file is opened non-blocking and checked before
// anything is read.
func ReadRegular(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes is over the limit of %d", path, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: over the limit of %d bytes", path, max)
	}
	return b, nil
}

// bytesProvider hands koanf a file already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }
func (b bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("config: bytesProvider: Read is not supported")
}
