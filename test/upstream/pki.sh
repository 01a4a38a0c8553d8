#!/bin/sh
# pki.sh DIR NODE_IP SERVICE_IP NODE_NAME [NODE_NAME2] writes the throw-away key material
# of one test/upstream cluster into DIR: a CA, the API server's serving pair,
# one client pair per component (each with the identity the bootstrap RBAC
# roles and the Node authorizer expect; kubelet-NODE_NAME2.crt for a second
# node) and the service-account key pair.
set -eu

dir=$1 node_ip=$2 service_ip=$3 node=$4 node2=${5:-}
mkdir -p "$dir"
cd "$dir"
umask 077

key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null; }

key ca
openssl req -x509 -new -key ca.key -subj /CN=edgeproxy-upstream-ca -days 2 -out ca.crt 2>/dev/null

# sign NAME SUBJECT EXTENSIONS
sign() {
	key "$1"
	openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
	printf '%s\n' "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
		-days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
	rm -f "$1.csr" "$1.ext"
}

client='basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'

sign apiserver /CN=kube-apiserver "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$node_ip,IP:$service_ip,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=edgeproxy-upstream-admin" "$client"
# The API server's client identity towards the kubelets (exec, logs,
# port-forward): system:masters, as kubeadm's apiserver-kubelet-client.
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
sign controller-manager /CN=system:kube-controller-manager "$client"
sign scheduler /CN=system:kube-scheduler "$client"
sign kubelet "/O=system:nodes/CN=system:node:$node" "$client"
[ -z "$node2" ] || sign "kubelet-$node2" "/O=system:nodes/CN=system:node:$node2" "$client"

key sa
openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
chmod 0644 ca.crt
