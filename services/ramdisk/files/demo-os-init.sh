#!/bin/sh
# Ferrum's demo OS: /init of the tiny OS `ferrum image build-demo` puts on a disk.
# It does what cloud-init's ConfigDrive datasource does first: find the
# file system labelled config-2, take the newest OpenStack metadata version
# it knows (else "latest"), and read meta_data.json's hostname and the user
# data. It prints them on the console (the serial port) and stays up.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1

log() { echo "ferrum-demo-os: $*"; }
log "booted from disk, kernel $(uname -r)"
while read -r module; do
    insmod "/lib/modules/$module" || log "cannot load $module"
done < /etc/ferrum/modules.order

# cloud-init's labels for a config drive; the disk's partitions appear a moment after its driver loads.
drive=""
tries=0
while [ -z "$drive" ] && [ "$tries" -lt 50 ]; do
    drive=$(findfs LABEL=config-2 2>/dev/null || findfs LABEL=CONFIG-2 2>/dev/null)
    [ -n "$drive" ] || { tries=$((tries + 1)); sleep 0.2; }
done
if [ -z "$drive" ]; then
    log "no config drive (no file system labelled config-2)"
else
    mkdir -p /mnt/config
    if mount -t iso9660 -o ro "$drive" /mnt/config 2>/dev/null || mount -t vfat -o ro "$drive" /mnt/config; then
        version=latest
        # cloud-init's known versions, newest first: the first one present wins.
        for candidate in 2018-08-27 2017-02-22 2016-10-06 2016-06-30 2015-10-15 2013-10-17 2013-04-04 2012-08-10; do
            if [ -e "/mnt/config/openstack/$candidate" ]; then
                version=$candidate
                break
            fi
        done
        dir=/mnt/config/openstack/$version
        log "config drive $drive, metadata version $version"
        name=$(tr -d '\n' < "$dir/meta_data.json" | sed -n 's/.*"hostname"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
        echo "hostname=$name"
        [ -n "$name" ] && hostname "$name"
        if [ -f "$dir/user_data" ]; then
            echo "user_data=$(head -n 1 "$dir/user_data")"
        else
            echo "user_data="
        fi
    else
        log "cannot mount the config drive $drive"
    fi
fi
log "ready"
while true; do sleep 3600; done
