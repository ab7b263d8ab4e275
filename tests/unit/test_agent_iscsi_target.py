"""The agent's iSCSI target: a real tgtd written to by a real initiator (qemu-img over libiscsi), no mocks.

The conductor writes images exactly this way, so these tests pin what it
relies on: the CHAP secret both sides derive, the initiator ACL, distinct
targets side by side, and a stop (or a failed start) that leaves no tgtd.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.agent.iscsi_target import IscsiTarget, Portal, TargetSpec
from services.common import errors
from services.common.iscsi_chap import chap_credentials

pytestmark = pytest.mark.skipif(
    not (shutil.which("tgtd") or os.path.exists("/usr/sbin/tgtd")) or not shutil.which("qemu-img"),
    reason="needs tgtd (package tgt) and qemu-img with libiscsi",
)

TGTD = shutil.which("tgtd") or "/usr/sbin/tgtd"
TGTADM = shutil.which("tgtadm") or "/usr/sbin/tgtadm"
NODE = "3d2c8a52-70f5-4f7a-9d61-0c1b2a3f4e55"
OTHER_NODE = "9b1e7c44-0a5d-4c1e-8f3a-2d6b5e4c3a21"
DEPLOY_KEY = "deploy-key-of-this-deploy"
CONDUCTOR_IQN = "iqn.2024-01.org.ferrum:conductor-1"
MIB = 1024 * 1024


def _child_tgtds() -> set[int]:
    """PIDs of tgtd processes (zombies included) that are children of this test process."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if comm == "tgtd" and ppid == os.getpid():
            found.add(int(entry))
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _sparse(path: Path, size: int = 64 * MIB) -> Path:
    with open(path, "wb") as fp:
        fp.truncate(size)
    return path


async def _port_accepts(port: int) -> bool:
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def qemu_write(
    tmp: Path, image: Path, portal: Portal, iqn: str, user: str, password: str, initiator: str
) -> tuple[int, str]:
    """Write ``image`` to LUN 1 as the conductor does; (exit status, stderr)."""
    secret = tmp / f"secret-{os.urandom(4).hex()}"
    secret.write_text(password)
    opts = (
        f"driver=iscsi,transport=tcp,portal={portal.address}:{portal.port},target={iqn},lun=1,"
        f"user={user},password-secret=s0,initiator-name={initiator}"
    )
    proc = await asyncio.create_subprocess_exec(
        "qemu-img",
        "convert",
        "-n",
        "-f",
        "raw",
        str(image),
        "--object",
        f"secret,id=s0,file={secret}",
        "--target-image-opts",
        opts,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode(errors="replace")


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(8 * MIB)
    path = tmp_path / "image.raw"
    path.write_bytes(data)
    return path, data


@pytest.fixture
async def make_target() -> AsyncIterator[Callable[..., IscsiTarget]]:
    """Builds IscsiTargets with this node's credentials; stops every one of them afterwards."""
    made: list[IscsiTarget] = []

    def make(backing: Path, *, node: str = NODE, initiator: str = CONDUCTOR_IQN, **kw: object) -> IscsiTarget:
        user, password = chap_credentials(DEPLOY_KEY, node)
        spec = TargetSpec(
            iqn=f"iqn.2008-10.org.openstack:{node}",
            backing_path=str(backing),
            chap_username=user,
            chap_password=password,
            initiator_iqn=initiator,
            **kw,  # type: ignore[arg-type]  # listen_host / portal_port from the test
        )
        target = IscsiTarget(spec, tgtd=TGTD, tgtadm=TGTADM)
        made.append(target)
        return target

    before = _child_tgtds()
    yield make
    for target in made:
        await target.stop()
    assert _child_tgtds() <= before, "a tgtd started by the test outlived it"


async def test_the_conductor_writes_an_image_with_chap_and_its_initiator_name(
    tmp_path: Path, image: tuple[Path, bytes], make_target: Callable[..., IscsiTarget]
) -> None:
    backing = _sparse(tmp_path / "disk.img")
    target = make_target(backing)
    portal = await target.start()
    assert portal == target.portal and portal.address == "127.0.0.1" and portal.port > 0
    assert target.running
    pid = target.pid
    assert pid is not None and _pid_alive(pid)
    # The data path's tuning (docs/deploy.md): 256 KiB data PDUs, long bursts, O_DIRECT on this disk.
    rc, shown, _err = await target._tgtadm("--lld", "iscsi", "--op", "show", "--mode", "target", "--tid", "1")
    assert rc == 0 and "MaxRecvDataSegmentLength=262144" in shown and "MaxBurstLength=16776192" in shown
    rc, shown, _err = await target._tgtadm("--lld", "iscsi", "--op", "show", "--mode", "target")
    assert rc == 0 and "Backing store flags: direct" in shown, shown

    user, password = chap_credentials(DEPLOY_KEY, NODE)  # what the conductor computes on its side
    rc, err = await qemu_write(tmp_path, image[0], portal, target.spec.iqn, user, password, CONDUCTOR_IQN)
    assert rc == 0, err
    with open(backing, "rb") as fp:
        assert fp.read(8 * MIB) == image[1]

    await target.stop()
    assert not target.running and target.portal is None and target.pid is None
    assert not _pid_alive(pid)
    assert not await _port_accepts(portal.port)


def _minor_faults(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[7])


async def test_tgtd_reuses_its_write_buffers_instead_of_faulting_in_fresh_pages(
    tmp_path: Path, make_target: Callable[..., IscsiTarget]
) -> None:
    """tgtd allocates a buffer per SCSI write; with glibc's defaults every page of every
    buffer came fresh from the kernel (one minor fault per 4 KiB written, half of tgtd's
    CPU time). With TGTD_MALLOC_TUNABLES the buffers are reused: far fewer faults than
    pages written (64 MiB: about 800 faults with transparent huge pages, about 4,000
    without, against 16,400 before)."""
    size = 64 * MIB
    chunk = os.urandom(MIB)  # not zeroes: zero runs never cross the wire (thin provisioning)
    source = tmp_path / "image.raw"
    with open(source, "wb") as fp:
        for n in range(size // MIB):
            fp.write(bytes([n]) + chunk[1:])
    backing = _sparse(tmp_path / "disk.img", size)
    target = make_target(backing)
    portal = await target.start()
    pid = target.pid
    assert pid is not None
    before = _minor_faults(pid)
    user, password = chap_credentials(DEPLOY_KEY, NODE)
    rc, err = await qemu_write(tmp_path, source, portal, target.spec.iqn, user, password, CONDUCTOR_IQN)
    assert rc == 0, err
    faults = _minor_faults(pid) - before
    pages = size // 4096
    assert faults < pages // 2, f"tgtd took {faults} minor faults for {pages} pages written"
    await target.stop()  # deletes the target, then kills tgtd: every write must still be on the disk
    assert not _pid_alive(pid)
    with open(backing, "rb") as disk, open(source, "rb") as image:
        assert disk.read() == image.read()


async def test_a_wrong_secret_or_initiator_cannot_log_in(
    tmp_path: Path, image: tuple[Path, bytes], make_target: Callable[..., IscsiTarget]
) -> None:
    backing = _sparse(tmp_path / "disk.img")
    target = make_target(backing)
    portal = await target.start()
    iqn = target.spec.iqn
    user, password = chap_credentials(DEPLOY_KEY, NODE)
    _, other_password = chap_credentials("another deploy's key", NODE)

    rc, err = await qemu_write(tmp_path, image[0], portal, iqn, user, other_password, CONDUCTOR_IQN)
    assert rc != 0 and "Authentication failure" in err
    rc, err = await qemu_write(tmp_path, image[0], portal, iqn, user, password, "iqn.2024-01.org.evil:intruder")
    assert rc != 0 and "Target not found" in err

    with open(backing, "rb") as fp:
        assert fp.read(8 * MIB) == bytes(8 * MIB)  # untouched


async def test_two_targets_serve_side_by_side(
    tmp_path: Path, image: tuple[Path, bytes], make_target: Callable[..., IscsiTarget]
) -> None:
    first = make_target(_sparse(tmp_path / "a.img"))
    # the second takes any initiator (no ACL by name), still behind CHAP
    second = make_target(_sparse(tmp_path / "b.img"), node=OTHER_NODE, initiator="")
    one, two = await asyncio.gather(first.start(), second.start())
    assert one.port != two.port and first.pid != second.pid
    assert first.control_port is not None and second.control_port is not None

    user1, password1 = chap_credentials(DEPLOY_KEY, NODE)
    user2, password2 = chap_credentials(DEPLOY_KEY, OTHER_NODE)
    results = await asyncio.gather(
        qemu_write(tmp_path, image[0], one, first.spec.iqn, user1, password1, CONDUCTOR_IQN),
        qemu_write(tmp_path, image[0], two, second.spec.iqn, user2, password2, "iqn.2024-01.org.example:anyone"),
    )
    assert [rc for rc, _ in results] == [0, 0], results
    for name in ("a.img", "b.img"):
        with open(tmp_path / name, "rb") as fp:
            assert fp.read(8 * MIB) == image[1]

    # each target knows only its own secret
    rc, err = await qemu_write(tmp_path, image[0], one, first.spec.iqn, user2, password2, CONDUCTOR_IQN)
    assert rc != 0 and "Authentication failure" in err


async def test_stop_is_idempotent_and_a_failed_start_leaves_no_tgtd(
    tmp_path: Path, make_target: Callable[..., IscsiTarget]
) -> None:
    never_started = make_target(_sparse(tmp_path / "disk.img"))
    await never_started.stop()

    target = make_target(_sparse(tmp_path / "disk2.img"), node=OTHER_NODE)
    await target.start()
    with pytest.raises(errors.AgentError, match="already started"):
        await target.start()
    await target.stop()
    await target.stop()
    assert not target.running

    before = _child_tgtds()
    missing = make_target(tmp_path / "no-such-disk.img")
    with pytest.raises(errors.AgentError) as caught:
        await missing.start()
    assert "no-such-disk.img" in caught.value.message and "No such file" in caught.value.message
    assert chap_credentials(DEPLOY_KEY, NODE)[1] not in caught.value.message
    assert not missing.running and missing.pid is None and missing.control_socket_base is None
    assert _child_tgtds() <= before


async def test_a_portal_tgtd_cannot_bind_is_a_failed_start(
    tmp_path: Path, make_target: Callable[..., IscsiTarget]
) -> None:
    # tgtd does not fail on a busy portal: it listens on 0.0.0.0:3260 instead.
    # That must never go unnoticed.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        target = make_target(_sparse(tmp_path / "disk.img"), portal_port=busy.getsockname()[1])
        before = _child_tgtds()
        with pytest.raises(errors.AgentError, match=r"did not listen on 127\.0\.0\.1:"):
            await target.start()
    assert _child_tgtds() <= before


class _CollidingTarget(IscsiTarget):
    """A target whose first two control-port picks are another running target's, in that one's control dir.

    With a private control dir per target a collision cannot happen by
    chance; this forces one to exercise the retry.
    """

    def __init__(self, spec: TargetSpec, holder: IscsiTarget) -> None:
        super().__init__(spec, tgtd=TGTD, tgtadm=TGTADM)
        self.holder = holder
        self.picks: list[int] = []

    def _prepare_dirs(self) -> None:
        super()._prepare_dirs()
        assert self._control_dir is not None and self.holder.control_socket_base is not None
        self._control_dir.rmdir()
        self._control_dir = Path(self.holder.control_socket_base).parent

    def _pick_control_port(self) -> int:
        held = self.holder.control_port
        assert held is not None
        self.picks.append(held if len(self.picks) < 2 else super()._pick_control_port())
        return self.picks[-1]

    def _remove_files(self) -> None:
        self._control_dir = None  # the holder's, removed by the holder
        super()._remove_files()


async def test_a_taken_control_port_is_retried_with_another(
    tmp_path: Path, image: tuple[Path, bytes], make_target: Callable[..., IscsiTarget]
) -> None:
    holder = make_target(_sparse(tmp_path / "a.img"))
    await holder.start()
    user, password = chap_credentials(DEPLOY_KEY, OTHER_NODE)
    spec = TargetSpec(f"iqn.2008-10.org.openstack:{OTHER_NODE}", str(_sparse(tmp_path / "b.img")), user, password, "")
    late = _CollidingTarget(spec, holder)
    try:
        portal = await late.start()
        assert late.picks[:2] == [holder.control_port] * 2 and late.control_port == late.picks[2]
        # the answer came from its own tgtd, not from the holder's on the same socket
        rc, err = await qemu_write(tmp_path, image[0], portal, spec.iqn, user, password, CONDUCTOR_IQN)
        assert rc == 0, err
        with open(tmp_path / "b.img", "rb") as fp:
            assert fp.read(8 * MIB) == image[1]
    finally:
        await late.stop()
    assert holder.running  # untouched by the other's start and stop


def test_chap_credentials_are_derived_from_the_deploy_key() -> None:
    user, password = chap_credentials(DEPLOY_KEY, NODE)
    assert (user, password) == chap_credentials(DEPLOY_KEY, NODE.upper())  # deterministic, canonical UUID
    assert user == "ferrum-3d2c8a52"
    assert len(password) == 16 and password.replace("-", "").replace("_", "").isalnum()
    assert chap_credentials("another key", NODE)[1] != password
    assert chap_credentials(DEPLOY_KEY, OTHER_NODE)[1] != password
    TargetSpec("iqn.2008-10.org.openstack:x", "/dev/sda", user, password, "")  # accepted as a secret
    with pytest.raises(errors.InvalidParameterValue):
        chap_credentials("", NODE)
    with pytest.raises(errors.InvalidParameterValue):
        chap_credentials(DEPLOY_KEY, "not-a-uuid")


@pytest.mark.parametrize(
    "change",
    [
        {"iqn": "not an iqn"},
        {"iqn": "iqn.2008-10.org.openstack:a,b"},
        {"initiator_iqn": "conductor"},
        {"backing_path": "relative/disk.img"},
        {"backing_path": "/tmp/a,b.img"},
        {"chap_username": "user,name"},
        {"chap_password": "short"},
        {"chap_password": "has,a,comma,in,it"},
        {"chap_password": "has a space in it"},
        {"chap_password": "x" * 256},
        {"listen_host": "localhost"},
        {"portal_port": 70000},
    ],
)
def test_bad_spec_values_are_refused(change: dict[str, object]) -> None:
    values: dict[str, object] = {
        "iqn": "iqn.2008-10.org.openstack:x",
        "backing_path": "/dev/sda",
        "chap_username": "ferrum-3d2c8a52",
        "chap_password": "aCmycCfyW5R12F3d",
        "initiator_iqn": CONDUCTOR_IQN,
    }
    values.update(change)
    with pytest.raises(errors.InvalidParameterValue):
        TargetSpec(**values)  # type: ignore[arg-type]
