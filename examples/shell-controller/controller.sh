#!/bin/sh
# controller.sh: a controller written in POSIX shell, a loop around kubectl,
# sharded by `sharder agent` (docs/membership.md, "A controller in another
# language"). It knows nothing of sharder beyond two labels.
#
# Every --poll-seconds it lists the ConfigMaps of --namespace that carry its
# instance's shard label shard.sharder.dev/<ring>=<name> and no drain label
# drain.sharder.dev/<ring>, and reconciles each one that changed since it
# last did: it sets the annotation shell-controller.sharder.dev/reconciled-by
# to its name, with the resourceVersion it listed as a precondition, so a
# write never lands on an object that was moved (or changed) after the list.
# An object that is being drained is left alone from the next list on; a
# reconcile starts only from a list less than a second old, and each kubectl
# call has 3 s, so the last reconcile of an object being drained ends within
# 4 s of the drain's start: before the ring's drainTimeout (5 s in
# config/ring.yaml) forces the move.
#
# It serves /healthz on --health-address for the agent's --health-url (a
# busybox httpd it runs and stops itself). On SIGTERM it finishes the
# reconcile in flight, stops that server, whose port then refuses
# connections, and exits: the agent releases the Lease only then.
#
# With --reconcile-log=FILE, each reconcile's start and end are appended to
# FILE as JSON lines, the format internal/reconcilelog reads.
#
# It runs in busybox's shell (the applets httpd, stat and touch) with kubectl
# on the PATH, or --kubectl; in a pod kubectl uses the pod's service account,
# elsewhere $KUBECONFIG. Flags take the form --flag=value:
#   --ring=RING              the ControllerRing (required)
#   --namespace=NAMESPACE    the ConfigMaps' namespace (required)
#   --name=NAME              the instance ID (default: $POD_NAME)
#   --health-address=[IP:]PORT  (default: 8081)
#   --reconcile-log=FILE     (default: none)
#   --poll-seconds=N         (default: 1)
#   --kubectl=PATH           (default: kubectl)
set -u

ring='' namespace='' name=${POD_NAME:-} health=8081 log='' poll=1 kubectl=kubectl
for arg in "$@"; do
	case $arg in
	--ring=*) ring=${arg#*=} ;;
	--namespace=*) namespace=${arg#*=} ;;
	--name=*) name=${arg#*=} ;;
	--health-address=*) health=${arg#*=} ;;
	--reconcile-log=*) log=${arg#*=} ;;
	--poll-seconds=*) poll=${arg#*=} ;;
	--kubectl=*) kubectl=${arg#*=} ;;
	*) echo "controller.sh: unknown argument $arg" >&2; exit 2 ;;
	esac
done
if [ -z "$ring" ] || [ -z "$namespace" ] || [ -z "$name" ]; then
	echo "controller.sh: --ring, --namespace and --name (or \$POD_NAME) are required" >&2
	exit 2
fi

annotation=shell-controller.sharder.dev/reconciled-by
selector="shard.sharder.dev/$ring=$name,!drain.sharder.dev/$ring"
# File times are read back in UTC.
export TZ=UTC

work=$(mktemp -d "${TMPDIR:-/tmp}/shell-controller.XXXXXX") || exit 1
clock=$work/clock
# Each call gets 3 s, from timeout rather than --request-timeout: with a
# client setting such as that flag, kubectl no longer falls back to the
# pod's service account when there is no kubeconfig.
k() { timeout 3 "$kubectl" --cache-dir="$work/kube-cache" "$@"; }

say() { echo "$(date -u '+%Y-%m-%dT%H:%M:%SZ') $*" >&2; }

# stamp sets now (RFC 3339 with nanoseconds) and millis (Unix time in
# milliseconds) from the modification time of a file touched now: busybox's
# date has no fractions of a second.
stamp() {
	touch "$clock"
	# shellcheck disable=SC2046 # "seconds date time zone", split in four
	set -- $(stat -c '%Y %y' "$clock")
	now="$2T$3Z"
	ms=${3#*.}
	ms=${ms%??????}
	# No leading zeros: the shell would read octal.
	ms=${ms#0}
	ms=${ms#0}
	millis=$(($1 * 1000 + ${ms:-0}))
}

# record PHASE OBJECT [ERROR] appends one line to the reconcile log.
record() {
	[ -n "$log" ] || return 0
	stamp
	error=''
	if [ -n "${3:-}" ]; then
		# Quotes and backslashes out, so that the line stays JSON.
		error=$(printf '%s' "$3" | tr -d '"\\' | tr '\n\r\t' '   ' | cut -c1-300)
		error=",\"error\":\"$error\""
	fi
	printf '{"time":"%s","instance":"%s","namespace":"%s","name":"%s","phase":"%s","generation":0%s}\n' \
		"$now" "$name" "$namespace" "$2" "$1" "$error" >>"$log"
}

# The health endpoint: a file served by busybox httpd, a child of this
# shell. A watcher stops it if the shell is killed outright, when nothing
# else would.
mkdir -p "$work/www" && : >"$work/www/healthz"
httpd -f -p "$health" -h "$work/www" &
httpd_pid=$!
shell_pid=$$
(while kill -0 "$shell_pid" 2>/dev/null; do sleep 1; done; kill "$httpd_pid" 2>/dev/null) &
watcher_pid=$!

# Up before the first reconcile, or the instance goes no further.
case $health in
*:*) probe=${health%:*} ;;
*) probe=127.0.0.1 ;;
esac
case $probe in '' | 0.0.0.0) probe=127.0.0.1 ;; esac
tries=0
until wget -q -O /dev/null "http://$probe:${health##*:}/healthz" 2>/dev/null; do
	tries=$((tries + 1))
	if ! kill -0 "$httpd_pid" 2>/dev/null || [ "$tries" -ge 50 ]; then
		say "the health server on $health did not start"
		kill "$watcher_pid" "$httpd_pid" 2>/dev/null
		rm -rf "$work"
		exit 1
	fi
	sleep 0.1
done

stopping=''
trap 'stopping=1' TERM INT
say "instance $name of ring $ring: reconciling ConfigMaps of $namespace labelled $selector"

# done lists "name=resourceVersion" of the objects as this instance last
# left them: an object listed with the same resourceVersion needs nothing.
done_list=' '
while [ -z "$stopping" ]; do
	if ! kill -0 "$httpd_pid" 2>/dev/null; then
		say "the health server on $health exited"
		kill "$watcher_pid" 2>/dev/null
		rm -rf "$work"
		exit 1
	fi
	stamp
	listed=$millis
	if objects=$(k -n "$namespace" get configmaps -l "$selector" \
		-o 'jsonpath={range .items[*]}{.metadata.name}{"="}{.metadata.resourceVersion}{"\n"}{end}' 2>"$work/err"); then
		next=' '
		for object in $objects; do
			object_name=${object%%=*} rv=${object#*=}
			case $done_list in
			*" $object "*)
				next="$next$object "
				continue
				;;
			esac
			stamp
			if [ -n "$stopping" ] || [ $((millis - listed)) -ge 1000 ]; then
				# The rest waits for the next list, which keeps what is known.
				next="$next${done_list# }"
				break
			fi
			record start "$object_name"
			patch="{\"metadata\":{\"resourceVersion\":\"$rv\",\"annotations\":{\"$annotation\":\"$name\"}}}"
			if out=$(k -n "$namespace" patch configmap "$object_name" --type=merge -p "$patch" \
				-o 'jsonpath={.metadata.resourceVersion}' 2>&1); then
				record end "$object_name"
				next="$next$object_name=$out "
			else
				# A conflict (the object changed or moved since the list)
				# or an error: the next list decides again.
				record end "$object_name" "$out"
				say "reconciling $object_name: $out"
			fi
		done
		done_list=$next
	else
		say "listing: $(cat "$work/err")"
	fi
	[ -n "$stopping" ] && break
	sleep "$poll" &
	wait $! 2>/dev/null
done

say "stopping: no reconcile in flight"
kill "$watcher_pid" "$httpd_pid" 2>/dev/null
wait "$httpd_pid" 2>/dev/null
rm -rf "$work"
exit 0
