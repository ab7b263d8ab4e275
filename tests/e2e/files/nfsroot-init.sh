#!/bin/sh
# The NFS-root test initramfs's /init (busybox sh, PID 1): what a kernel without
# CONFIG_ROOT_NFS / CONFIG_IP_PNP (Debian's) needs to honour
#   root=/dev/nfs nfsroot=[<server>:]<path>[,<options>] ip=dhcp rw|ro
# It loads the NIC and NFS client modules, takes an address by DHCP, mounts the
# export (mount(2) with the kernel's text options, plus addr=<server>) and
# switches to it: the export's /sbin/init runs with the NFS export as /. An
# export without an executable /sbin/init gets the marker printed from here.
# Everything goes to the console (console=ttyS0: the serial port).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /newroot
exec </dev/null >/dev/console 2>&1

log() { echo "ferrum-nfsroot: $*"; }
fail() {
    log "ERROR: $*"
    log "powering off"
    sleep 1
    poweroff -f
    sleep 60
}

log "kernel $(uname -r) up $(cut -d' ' -f1 /proc/uptime) s; loading drivers"
log "kernel command line: $(cat /proc/cmdline)"
while read -r module; do
    insmod "/lib/modules/$module" || log "cannot load $module"
done </etc/ferrum/modules.order

nfsroot="" mode=ro bootif=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        nfsroot=*) nfsroot=${word#nfsroot=} ;;
        BOOTIF=*) bootif=$(echo "${word#BOOTIF=}" | tr 'A-F-' 'a-f:') ;;
        rw) mode=rw ;;
        ro) mode=ro ;;
    esac
done
bootif=${bootif#01:}
[ -n "$nfsroot" ] || fail "no nfsroot= on the kernel command line: $(cat /proc/cmdline)"

# The NIC: the one BOOTIF names, else the first one the drivers found.
ip link set lo up
nic="" tries=0
while [ -z "$nic" ] && [ "$tries" -lt 50 ]; do
    for path in /sys/class/net/*; do
        name=${path##*/}
        [ "$name" = lo ] && continue
        if [ -z "$bootif" ] || [ "$(cat "$path/address")" = "$bootif" ]; then
            nic=$name
            break
        fi
    done
    [ -n "$nic" ] || { tries=$((tries + 1)); sleep 0.2; }
done
[ -n "$nic" ] || fail "no network interface (BOOTIF=${bootif:-any}); drivers: $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"
log "DHCP on $nic ($(cat "/sys/class/net/$nic/address"))"
udhcpc -i "$nic" -s /etc/ferrum/udhcpc.script -t 10 -T 2 -n -q -f ||
    fail "no DHCP lease on $nic"
. /run/ferrum-dhcp

# nfsroot=[<server>:]<path>[,<options>]: without a server, the DHCP server's
# next-server (siaddr); "%s" in the path stands for this machine's address.
spec=${nfsroot%%,*}
options=""
[ "$spec" = "$nfsroot" ] || options=${nfsroot#*,}
case "$spec" in
    *:*) server=${spec%%:*} path=${spec#*:} ;;
    *) server=${dhcp_siaddr:-} path=$spec ;;
esac
path=$(echo "$path" | sed "s/%s/$dhcp_ip/g")
[ -n "$server" ] || fail "nfsroot=$nfsroot names no server and DHCP gave no next-server"
fstype=nfs
case ",$options," in
    *,vers=4*|*,nfsvers=4*) fstype=nfs4 ;;
esac
case ",$options," in
    *,addr=*) ;;
    *) options="${options:+$options,}addr=$server" ;;
esac
# vers=4 leaves the minor version to the kernel, which then asks for 4.0 only
# (mount.nfs would negotiate): try 4.2, 4.1, 4.0 as mount.nfs does.
attempts=$options
case ",$options," in
    *,vers=4,* | *,nfsvers=4,*)
        attempts=""
        for minor in 2 1 0; do
            attempts="$attempts $(echo ",$options," | sed "s/,\(nfs\)\{0,1\}vers=4,/,vers=4.$minor,/; s/^,//; s/,\$//")"
        done
        ;;
esac
mounted=""
for attempt in $attempts; do
    log "mount -t $fstype -o $mode,$attempt $server:$path /newroot"
    if mount -t "$fstype" -o "$mode,$attempt" "$server:$path" /newroot; then
        mounted=$attempt
        break
    fi
done
[ -n "$mounted" ] || fail "cannot mount $server:$path (nfsroot=$nfsroot)"
log "mounted: $(grep ' /newroot ' /proc/mounts)"

if [ -x /newroot/sbin/init ]; then
    log "switching to the NFS root's /sbin/init"
    for fs in dev proc sys; do
        mkdir -p "/newroot/$fs" 2>/dev/null
        mount --move "/$fs" "/newroot/$fs" || umount "/$fs"
    done
    exec switch_root /newroot /sbin/init
    fail "switch_root to $server:$path failed"
fi
[ -f /newroot/ferrum-marker ] || fail "the NFS root has neither /sbin/init nor /ferrum-marker"
echo "FERRUM-NFS-ROOT: $(cat /newroot/ferrum-marker)"
sync
poweroff -f
