"""Child processes that end with their parent.

A conductor killed mid-write must not leave its ``qemu-img`` writing (the
conductor that takes the node over writes again, and two writers would
race), and an agent that dies must not leave ``tgtd`` exposing its disk.
util-linux's ``setpriv --pdeathsig KILL`` sets the parent-death signal and
then execs the program, so the PID stays the child's. BusyBox's ``setpriv``
(the deploy ramdisk's) has no ``--pdeathsig``: there the prefix is empty and
the agent's own stop takes its children down.
"""

from __future__ import annotations

import os
import shutil


def dies_with_parent() -> tuple[str, ...]:
    """The argv prefix that makes a child get SIGKILL when its parent dies, or () where none exists."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.path.basename(os.path.realpath(setpriv)) == "busybox":
        return ()
    return (setpriv, "--pdeathsig", "KILL")
