#!/bin/sh
# Ferrum's deploy ramdisk: /init (busybox sh), run by the kernel as PID 1.
# It loads the NIC and disk drivers, takes an address by DHCP and runs the
# deploy agent with its parameters from /proc/cmdline. Everything it and the
# agent print goes to the kernel's console (console=ttyS0 on the command
# line: the serial port), which is what an operator and the BMC can see.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 PYTHONUTF8=1 PYTHONDONTWRITEBYTECODE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
exec </dev/null >/dev/console 2>&1

log() { echo "ferrum-ramdisk: $*"; }
log "kernel $(uname -r) up $(cut -d' ' -f1 /proc/uptime) s; loading drivers"
while read -r module; do
    insmod "/lib/modules/$module" || log "cannot load $module"
done < /etc/ferrum/modules.order

# The NIC the firmware booted from: BOOTIF=01-aa-bb-.. (or aa:bb:..), else every NIC.
bootif=$(sed -n 's/.*BOOTIF=\([^ ]*\).*/\1/p' /proc/cmdline | tr 'A-F-' 'a-f:')
bootif=${bootif#01:}
ip link set lo up
nics=""
tries=0
while [ -z "$nics" ] && [ "$tries" -lt 50 ]; do
    for path in /sys/class/net/*; do
        name=${path##*/}
        [ "$name" = lo ] && continue
        if [ -z "$bootif" ] || [ "$(cat "$path/address")" = "$bootif" ]; then
            nics="$nics $name"
        fi
    done
    [ -n "$nics" ] || { tries=$((tries + 1)); sleep 0.2; }
done
[ -n "$nics" ] || log "no network interface matches BOOTIF=${bootif:-any}"
for nic in $nics; do
    log "DHCP on $nic ($(cat /sys/class/net/$nic/address))"
    udhcpc -i "$nic" -s /etc/ferrum/udhcpc.script -t 10 -T 2 -b -p "/run/udhcpc-$nic.pid"
done

# A baseline for bench/vm_deploy.py: ferrum-bench-dd=<MiB> times dd of zeros onto the first
# disk (synced) before the agent starts, to set the agent's write rate against.
dd_mib=$(sed -n 's/.*ferrum-bench-dd=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$dd_mib" ]; then
    disk=$(ls /sys/block | grep -v -E '^(loop|ram|zram|sr|fd)' | head -n 1)
    begin=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/zero of="/dev/$disk" bs=1M count="$dd_mib" conv=fsync 2>/dev/null
    end=$(cut -d' ' -f1 /proc/uptime)
    log "dd wrote $dd_mib MiB to /dev/$disk in $(echo "$begin $end" | awk '{printf "%.2f", $2 - $1}') s"
fi

# What the drivers found (the agent writes disks only; CD and floppy are virtual media).
log "block devices: $(ls /sys/block | tr '\n' ' ')"

# The agent: restarted (after a pause) if it ever exits, as a service manager would.
cd /opt/ferrum
while true; do
    log "starting the deploy agent"
    PYTHONPATH=/opt/ferrum python3 -m services.agent --kernel-cmdline /proc/cmdline --discover-disks \
        --listen-host 0.0.0.0 --tmp-dir /tmp \
        --power-off-command "poweroff -f" --reboot-command "reboot -f"
    log "the deploy agent exited with status $?; restarting it in 10 s"
    sleep 10
done
