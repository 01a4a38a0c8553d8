package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// KubeVersion is the Kubernetes release test/cluster/build.sh builds.
const KubeVersion = "v1.36.3"

// Binary names in the binary directory. kube-proxy is built for the
// benchmarks and is not needed to start a cluster.
const (
	EtcdBinary                  = "etcd"
	APIServerBinary             = "kube-apiserver"
	ControllerManagerBinary     = "kube-controller-manager"
	KubeProxyBinary             = "kube-proxy"
	binaryEnv                   = "EDGEPROXY_K8S_BIN"
	cacheEnv                    = "EDGEPROXY_CACHE"
	notBuiltHint                = "kube binaries not built: run test/cluster/build.sh"
	defaultCacheDirUnderHomeDir = ".cache/edgeproxy"
)

// ErrNotBuilt is returned (wrapped) by BinDir when the binaries are missing.
var ErrNotBuilt = errors.New(notBuiltHint)

// BinDir returns the directory holding the control-plane binaries:
// $EDGEPROXY_K8S_BIN when set, else the cache build.sh writes to,
// ${EDGEPROXY_CACHE:-$HOME/.cache/edgeproxy}/k8s-v1.36.3/bin. It fails with
// an error wrapping ErrNotBuilt unless etcd, kube-apiserver and
// kube-controller-manager are all there and executable.
func BinDir() (string, error) {
	dir := os.Getenv(binaryEnv)
	if dir == "" {
		cache := os.Getenv(cacheEnv)
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("cluster: find binaries: %w (set %s or %s)", err, binaryEnv, cacheEnv)
			}
			cache = filepath.Join(home, defaultCacheDirUnderHomeDir)
		}
		dir = filepath.Join(cache, "k8s-"+KubeVersion, "bin")
	}
	for _, name := range []string{EtcdBinary, APIServerBinary, ControllerManagerBinary} {
		if err := executable(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("cluster: %w: %w", ErrNotBuilt, err)
		}
	}
	return dir, nil
}

// BinPath returns the path of one binary in BinDir, e.g. KubeProxyBinary.
func BinPath(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if err := executable(p); err != nil {
		return "", fmt.Errorf("cluster: %w: %w", ErrNotBuilt, err)
	}
	return p, nil
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
