#!/bin/sh
# Boot one simulated host: run by fleet.py as
#   ip netns exec NS unshare --mount --uts --propagation slave -- \
#       /bin/sh host-init.sh NAME HOSTDIR CONFIG HOME REMOTE_HOME [SSHD OPTION ...]
# so every mount below exists only in this host's private mount namespace (slave propagation still lets
# the root namespace's unmounts reach it). It shows the host's fake hardware at the real paths, then
# replaces itself with sshd (given the options after REMOTE_HOME), keeping the pid fleet.py started.
set -eu
name=$1 hostdir=$2 config=$3 home=$4 remote_home=$5
shift 5

# graft PARENT NAME: create PARENT/NAME where the root filesystem lacks it, without touching the real
# PARENT: a tmpfs goes over PARENT and every original entry is bind-mounted back into it.
graft() {
    parent=$1 child=$2
    stash=$hostdir/stash$(printf '%s' "$parent" | tr / _)
    mkdir -p "$stash"
    mount --rbind "$parent" "$stash"
    mount -t tmpfs -o "mode=$(stat -c %a "$parent"),uid=0,gid=0,size=1m" fleetsim "$parent"
    for entry in "$stash"/* "$stash"/.[!.]*; do
        if [ "$parent/${entry##*/}" = /dev/ptmx ]; then
            # The kernel finds a ptmx node's devpts instance as `pts` beside the node within the node's own
            # mount; a bind-mounted node has none (openpty: ENOENT, sshd: "PTY allocation request failed").
            ln -s pts/ptmx /dev/ptmx
        elif [ -L "$entry" ]; then
            cp -P "$entry" "$parent/"
        elif [ -d "$entry" ]; then
            mkdir "$parent/${entry##*/}" && mount --rbind "$entry" "$parent/${entry##*/}"
        elif [ -e "$entry" ]; then
            touch "$parent/${entry##*/}" && mount --bind "$entry" "$parent/${entry##*/}"
        fi
    done
    mkdir "$parent/$child"
    umount -l "$stash"
}

# place SOURCE TARGET: bind SOURCE over TARGET, grafting TARGET into existence first if needed.
place() {
    [ -e "$2" ] || graft "$(dirname "$2")" "$(basename "$2")"
    mount --bind "$1" "$2"
}

hostname "$name"
# A host needs none of the machine's network namespace handles (every fleet's, under /run/netns): without
# this copy, `ip netns del` of any fleet frees its namespace at once, and a new one is no longer propagated
# into every running host's mount table (which made a fleet's mounts quadratic in its size).
umount -l /run/netns 2>/dev/null || :
# This host's /home holds its own account's home only (stored under the fleet's workdir).
mount -t tmpfs -o mode=755,uid=0,gid=0,size=1m fleetsim-home /home
mkdir "$remote_home"
mount --bind "$home" "$remote_home"
place "$hostdir/bin" /usr/local/bin
place "$hostdir/models" /srv/models
[ -d /run/sshd ] || place "$hostdir/privsep" /run/sshd
[ ! -d "$hostdir/infiniband" ] || place "$hostdir/infiniband" /sys/class/infiniband
[ ! -d "$hostdir/dev-infiniband" ] || place "$hostdir/dev-infiniband" /dev/infiniband
exec /usr/sbin/sshd -D -e -f "$config" "$@"
