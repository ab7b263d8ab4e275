#!/bin/busybox sh
# /sbin/init of the test NFS root (the export itself): runs with the NFS export
# as /, prints the marker stored on it and leaves a file behind (proof of rw).
bb=/bin/busybox
[ -r /proc/mounts ] || $bb mount -t proc proc /proc
echo "ferrum-nfsroot: / is now: $($bb grep ' / ' /proc/mounts | $bb tail -n 1)"
echo "FERRUM-NFS-ROOT: $($bb cat /ferrum-marker)"
echo "booted $($bb uname -r) up $($bb cut -d' ' -f1 /proc/uptime) s" >/ferrum-booted &&
    echo "ferrum-nfsroot: wrote /ferrum-booted on the NFS root"
$bb sync
$bb poweroff -f
