#!/bin/sh
# edgeproxy with offline.snapshotInterval 1h: the bench's agent, with no
# snapshot write during the S2 flips (an experiment, issue 27 S2 p99).
if [ "$1" = run ] && [ "$2" = --config ]; then
	conf="$3"
	new="${conf%.yaml}-nosnap.yaml"
	cp "$conf" "$new"
	printf 'offline:\n  snapshotInterval: 1h\n' >> "$new"
	shift 3
	exec /tmp/s2-edgeproxy-before run --config "$new" "$@"
fi
exec /tmp/s2-edgeproxy-before "$@"
