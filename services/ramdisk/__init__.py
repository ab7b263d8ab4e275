"""Boot images built from this machine's Debian package sources (issue 20).

- ``deploy_ramdisk``: ``ferrum ramdisk build``, Debian's kernel plus an
  initramfs that boots Ferrum's agent;
- ``demo_os``: ``ferrum image build-demo``, a bootable GPT disk image whose
  tiny OS prints what it finds on its config drive;
- ``debian``, ``kernel``, ``kmod``, ``rootfs``, ``cpio``, ``python_runtime``,
  ``agent_code``: the steps they share, one job each.
"""
