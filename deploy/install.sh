#!/bin/sh
# install.sh — install edgeproxy on a node, or stage it under DESTDIR.
#
# Usage: deploy/install.sh [NAME=VALUE ...]
#
# Every setting may be given as an argument (as `make install` passes them) or
# in the environment; arguments win.
#
#   DESTDIR        staging root prepended to every path (default: empty, the
#                  live system)
#   BINARY         the built edgeproxy binary (default: bin/edgeproxy in the
#                  source tree)
#   MODULES        a directory of built example policy modules (*.wasm, e.g.
#                  from `modules/build.sh DIR`); skipped when empty or absent
#   PREFIX         /usr/local
#   BINDIR         $PREFIX/bin
#   MODULEDIR      $PREFIX/lib/edgeproxy/modules   (example modules)
#   DATADIR        $PREFIX/share/edgeproxy         (rbac.yaml, kubeconfig template)
#   SYSCONFDIR     /etc                            (edgeproxy/config.yaml)
#   UNITDIR        /etc/systemd/system
#   MODULESLOADDIR /etc/modules-load.d
#   TMPFILESDIR    /etc/tmpfiles.d
#
# The config file is installed only when none exists, so re-running the script
# (an upgrade) keeps the node's settings; the new example is put next to it as
# config.yaml.example. The unit's ExecStart and --config follow BINDIR and
# SYSCONFDIR, the module paths in the config's comments MODULEDIR. Nothing is
# started: the script prints the commands that do it.
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)

for arg; do
	case $arg in
	DESTDIR=* | BINARY=* | MODULES=* | PREFIX=* | BINDIR=* | MODULEDIR=* | DATADIR=* | \
		SYSCONFDIR=* | UNITDIR=* | MODULESLOADDIR=* | TMPFILESDIR=*)
		name=${arg%%=*}
		eval "$name=\${arg#*=}"
		;;
	-h | --help)
		sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "install.sh: unknown argument '$arg' (want NAME=VALUE; see --help)" >&2
		exit 2
		;;
	esac
done

DESTDIR=${DESTDIR:-}
BINARY=${BINARY:-$src/bin/edgeproxy}
MODULES=${MODULES:-}
PREFIX=${PREFIX:-/usr/local}
BINDIR=${BINDIR:-$PREFIX/bin}
MODULEDIR=${MODULEDIR:-$PREFIX/lib/edgeproxy/modules}
DATADIR=${DATADIR:-$PREFIX/share/edgeproxy}
SYSCONFDIR=${SYSCONFDIR:-/etc}
UNITDIR=${UNITDIR:-/etc/systemd/system}
MODULESLOADDIR=${MODULESLOADDIR:-/etc/modules-load.d}
TMPFILESDIR=${TMPFILESDIR:-/etc/tmpfiles.d}

die() {
	echo "install.sh: $*" >&2
	exit 1
}

[ -f "$BINARY" ] && [ -x "$BINARY" ] || die "no executable binary at $BINARY (build it, or pass BINARY=...)"
for d in "$BINDIR" "$MODULEDIR" "$DATADIR" "$SYSCONFDIR" "$UNITDIR" "$MODULESLOADDIR" "$TMPFILESDIR"; do
	case $d in
	/*) ;;
	*) die "directory '$d' must be absolute" ;;
	esac
done

confdir=$SYSCONFDIR/edgeproxy

echo "installing edgeproxy into ${DESTDIR:-/}"
install -d -m 0755 "$DESTDIR$BINDIR" "$DESTDIR$confdir" "$DESTDIR$DATADIR" \
	"$DESTDIR$UNITDIR" "$DESTDIR$MODULESLOADDIR" "$DESTDIR$TMPFILESDIR"
install -m 0755 "$BINARY" "$DESTDIR$BINDIR/edgeproxy"

# The unit, with its paths following BINDIR and SYSCONFDIR.
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed -e "s|/usr/local/bin/edgeproxy |$BINDIR/edgeproxy |" \
	-e "s|--config /etc/edgeproxy/config.yaml|--config $confdir/config.yaml|" \
	"$src/deploy/edgeproxy.service" >"$tmp"
install -m 0644 "$tmp" "$DESTDIR$UNITDIR/edgeproxy.service"

install -m 0644 "$src/deploy/modules-load.d/edgeproxy-ipvs.conf" "$DESTDIR$MODULESLOADDIR/edgeproxy-ipvs.conf"
install -m 0644 "$src/deploy/tmpfiles.d/edgeproxy.conf" "$DESTDIR$TMPFILESDIR/edgeproxy.conf"

# The example config, with the module paths in its comments following
# MODULEDIR.
sed -e "s|/usr/local/lib/edgeproxy/modules|$MODULEDIR|g" "$src/configs/edgeproxy.yaml" >"$tmp"
if [ -e "$DESTDIR$confdir/config.yaml" ]; then
	echo "keeping existing $confdir/config.yaml; the new example is config.yaml.example"
	install -m 0644 "$tmp" "$DESTDIR$confdir/config.yaml.example"
else
	install -m 0644 "$tmp" "$DESTDIR$confdir/config.yaml"
fi

install -m 0644 "$src/deploy/rbac.yaml" "$src/deploy/kubeconfig.template" "$DESTDIR$DATADIR/"

if [ -n "$MODULES" ] && [ -d "$MODULES" ]; then
	install -d -m 0755 "$DESTDIR$MODULEDIR"
	n=0
	for m in "$MODULES"/*.wasm; do
		[ -f "$m" ] || continue
		install -m 0644 "$m" "$DESTDIR$MODULEDIR/"
		n=$((n + 1))
	done
	echo "installed $n example policy modules into $MODULEDIR"
elif [ -n "$MODULES" ]; then
	echo "no module directory $MODULES; skipping example policy modules"
fi

if [ -z "$DESTDIR" ]; then
	cat <<EOF
done. Next steps (see deploy/README.md):
  1. put a node kubeconfig at $confdir/kubeconfig and set 'kubeconfig:' in $confdir/config.yaml
  2. systemd-tmpfiles --create $TMPFILESDIR/edgeproxy.conf
     systemctl restart systemd-modules-load.service     # IPVS mode
  3. systemctl daemon-reload && systemctl enable --now edgeproxy.service
EOF
fi
