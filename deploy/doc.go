// Package deploy holds no code: it is the home of the systemd unit, the
// modules-load.d and tmpfiles.d files, RBAC, the kubeconfig template, the
// optional DaemonSet and install.sh. Its tests check those files with the
// real tools (install.sh, systemd-analyze, systemd-tmpfiles, modinfo) and
// decode the manifests into the Kubernetes API types.
package deploy
