package vm

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
)

// cpioWriter writes the "newc" (SVR4, no CRC) cpio format that the kernel
// unpacks into its initramfs. Only what an initramfs needs: directories,
// regular files, symlinks and character devices.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	n   int64 // bytes written, for padding
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: bufio.NewWriter(w), ino: 300000} }

const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioLink = 0o120000
	cpioChr  = 0o020000
)

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	var n int
	n, c.err = c.w.Write(b)
	c.n += int64(n)
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// entry writes one header, the name and the data; rdev is (major, minor)
// for device nodes.
func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmaj, rmin uint32) {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad()
	c.write(data)
	c.pad()
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	c.entry(name, cpioDir|uint32(perm.Perm()), nil, 0, 0)
}

// File adds a regular file.
func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.entry(name, cpioReg|uint32(perm.Perm()), data, 0, 0)
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, cpioLink|0o777, []byte(target), 0, 0)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm fs.FileMode, major, minor uint32) {
	c.entry(name, cpioChr|uint32(perm.Perm()), nil, major, minor)
}

// Close writes the trailer and flushes.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
