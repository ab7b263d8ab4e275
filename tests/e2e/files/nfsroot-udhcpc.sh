#!/bin/sh
# busybox udhcpc's hook in the NFS-root initramfs: configure the lease and keep
# what /init needs (address, next-server) in /run/ferrum-dhcp.
case "$1" in
    deconfig)
        ip addr flush dev "$interface"
        ip link set "$interface" up
        ;;
    bound | renew)
        ip addr flush dev "$interface"
        ip addr add "$ip/${mask:-24}" dev "$interface"
        for gateway in $router; do
            ip route add default via "$gateway" dev "$interface" && break
        done
        {
            echo "dhcp_ip='$ip'"
            echo "dhcp_siaddr='${siaddr:-}'"
        } >/run/ferrum-dhcp
        echo "ferrum-nfsroot: $interface has $ip/${mask:-24} via ${router:-no router}, next-server ${siaddr:-none}"
        ;;
esac
exit 0
