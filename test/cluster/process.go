package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long a process gets after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// process is one started control-plane program. Its output goes to a log
// file; a goroutine owned by the process waits for it and closes done, so
// it ends when the program ends (which stop guarantees).
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
	err     error // the exit status; valid once done is closed
}

// startProcess runs bin with args, appending its output to logPath.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: %s: log file: %w", name, err)
	}
	fmt.Fprintf(log, "==== %s %s %q\n", time.Now().Format(time.RFC3339Nano), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the test binary dies without stopping us, so do we.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("cluster: %s: start %s: %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to stopGrace, then sends SIGKILL and waits
// for the exit. It is safe to call on a process that has already ended.
func (p *process) stop() error {
	if ended, _ := p.exited(); ended {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("cluster: %s: SIGTERM pid %d: %w", p.name, p.cmd.Process.Pid, err)
	}
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("cluster: %s: SIGKILL pid %d: %w", p.name, p.cmd.Process.Pid, err)
	}
	<-p.done
	return nil
}

// tailFile returns the last n lines of the file at path.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	b = bytes.TrimRight(b, "\n")
	for i, idx := 0, len(b); i < n; i++ {
		idx = bytes.LastIndexByte(b[:idx], '\n')
		if idx < 0 {
			return string(b)
		}
		if i == n-1 {
			return string(b[idx+1:])
		}
	}
	return string(b)
}
