"""Secrets at rest, the parts without a database: the keyring and its key
file, one sealed value, and the node-row rule for which values get sealed."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.common import errors
from services.common.config import ConfigError, load_settings
from services.common.db.node_secrets import NodeSecrets
from services.common.keyring import Keyring, KeyringError, derived_key_id, load_keyring, parse_key_lines
from services.common.sealed_values import PREFIX, open_sealed, seal, sealed_key_id
from services.common.secret_keys import is_secret_key

NODE = "6f0e3d0c-2b4f-4c3e-9a59-0d7c1a1e0001"
OTHER = "6f0e3d0c-2b4f-4c3e-9a59-0d7c1a1e0002"


def key_text(key: bytes) -> str:
    return base64.b64encode(key).decode()


def keyring(*named: tuple[str, bytes]) -> Keyring:
    return Keyring(list(named))


KEY_A, KEY_B = os.urandom(32), os.urandom(32)


# -- which keys are secret ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["redfish_password", "ipmi_password", "agent_secret_token", "ssh_private_key", "configdrive", "API_Token"]
)
def test_secret_looking_keys(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name", ["redfish_address", "redfish_username", "deploy_kernel", "deploy_ramdisk", "image_source", "root_gb"]
)
def test_ordinary_keys(name: str) -> None:
    assert not is_secret_key(name)


# -- the keyring ----------------------------------------------------------------------------------


def test_key_file_lines_first_is_current(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2025-01\nnew:{key_text(KEY_B)}\n\n{key_text(KEY_A)}\n")
    path.chmod(0o600)
    ring = load_keyring(secret_key="", secret_key_file=str(path))
    assert ring.ids == ("new", derived_key_id(KEY_A)) and ring.current_id == "new"
    assert ring.cipher(derived_key_id(KEY_A)) is not None and ring.cipher("gone") is None


def test_single_key_from_the_environment() -> None:
    ring = Keyring.from_config(load_settings({"FERRUM_SECURITY_SECRET_KEY": key_text(KEY_A)}).security)
    assert ring.enabled and ring.ids == (derived_key_id(KEY_A),)
    assert not Keyring.from_config(load_settings({}).security).enabled  # no key: encryption at rest is off


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no key"),
        ("a:" + key_text(os.urandom(16)), "is 16 bytes, not 32"),
        ("a:not base64!", "is not base64"),
        ("bad id:" + key_text(KEY_A), "key id"),
        (f"a:{key_text(KEY_A)}\na:{key_text(KEY_B)}", "appears twice"),
    ],
    # ids without the random keys: parallel workers (pytest-xdist) must collect the same names
    ids=["empty", "short-key", "not-base64", "bad-id", "twice"],
)
def test_bad_key_files_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(KeyringError, match=message):
        parse_key_lines(text, source="keys")


@pytest.mark.parametrize("mode, ok", [(0o600, True), (0o640, True), (0o644, False), (0o660, False)])
def test_key_file_mode(tmp_path: Path, mode: int, ok: bool) -> None:
    path = tmp_path / "keys"
    path.write_text(key_text(KEY_A) + "\n")
    path.chmod(mode)
    if ok:
        assert load_keyring(secret_key="", secret_key_file=str(path)).enabled
    else:
        with pytest.raises(KeyringError, match="other users may read it or its group may change it"):
            load_keyring(secret_key="", secret_key_file=str(path))


def test_missing_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match=r"cannot open the secret key file .*/nope"):
        load_keyring(secret_key="", secret_key_file=str(tmp_path / "nope"))


@pytest.mark.parametrize(
    "env, message",
    [
        ({"FERRUM_SECURITY_SECRET_KEY": "short"}, "is not base64|bytes, not 32"),
        (
            {"FERRUM_SECURITY_SECRET_KEY": key_text(KEY_A), "FERRUM_SECURITY_SECRET_KEY_FILE": "/k"},
            "not both",
        ),
    ],
)
def test_bad_key_configuration_is_a_config_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


# -- one sealed value -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["s3cr3t", "", 42, True, {"user": "u", "password": "p"}, ["a", 1]])
def test_values_round_trip_with_their_type(value: object) -> None:
    ring = keyring(("a", KEY_A))
    sealed = seal(ring, value, context="here")
    assert sealed.startswith(f"{PREFIX}a:") and sealed_key_id(sealed) == "a"
    assert json.dumps(value) not in sealed or value in ("", 42, True)  # nothing readable in the ciphertext
    assert open_sealed(ring, sealed, context="here", where="x") == value


def test_another_context_does_not_decrypt() -> None:
    ring = keyring(("a", KEY_A))
    sealed = seal(ring, "s3cr3t", context="node 1")
    with pytest.raises(errors.SecretUnreadable, match="copied from another node or field"):
        open_sealed(ring, sealed, context="node 2", where="node 2 driver_info.redfish_password")


def test_a_wrong_key_fails_clearly_not_garbage() -> None:
    sealed = seal(keyring(("a", KEY_A)), "s3cr3t", context="c")
    with pytest.raises(errors.SecretUnreadable, match="does not decrypt with key 'a'"):
        open_sealed(keyring(("a", KEY_B)), sealed, context="c", where="w")  # same id, other key bytes
    with pytest.raises(errors.SecretUnreadable, match=r"key 'a', which is not configured .*keys held: b"):
        open_sealed(keyring(("b", KEY_B)), sealed, context="c", where="w")
    with pytest.raises(errors.SecretUnreadable, match="no secret key is configured"):
        open_sealed(Keyring(), sealed, context="c", where="w")


@pytest.mark.parametrize("mangle", [lambda s: s[:-4] + "AAAA", lambda s: s[:20], lambda s: s + "!!"])
def test_altered_values_are_refused(mangle) -> None:
    ring = keyring(("a", KEY_A))
    with pytest.raises(errors.SecretUnreadable):
        open_sealed(ring, mangle(seal(ring, "s3cr3t", context="c")), context="c", where="w")


# -- node rows ------------------------------------------------------------------------------------


def node_values() -> dict:
    return {
        "driver_info": {
            "redfish_address": "https://bmc",
            "redfish_password": "bmc-pass",
            "nested": {"ipmi_password": "inner", "port": 623, "users": [{"token": "t1", "name": "n"}]},
            "empty_password": None,
        },
        "driver_internal_info": {"agent_secret_token": "agent-tok-123", "agent_url": "http://agent"},
        "instance_info": {"configdrive": {"meta_data": {"hostname": "h"}}, "image_source": "http://img"},
        "extra": {"password": "extra is not a sealed field"},
    }


def test_node_secrets_are_sealed_everywhere_and_open_back() -> None:
    secrets = NodeSecrets(keyring(("a", KEY_A)))
    stored = secrets.seal(NODE, node_values())
    flat = json.dumps(stored)
    for plaintext in ("bmc-pass", "inner", '"t1"', "agent-tok-123", "hostname"):
        assert plaintext not in flat
    assert stored["driver_info"]["redfish_address"] == "https://bmc"  # not secret: as it was
    assert stored["driver_info"]["nested"]["port"] == 623 and stored["driver_info"]["empty_password"] is None
    assert stored["driver_internal_info"]["agent_url"] == "http://agent"
    assert stored["extra"] == {"password": "extra is not a sealed field"}
    assert secrets.open({"uuid": NODE, **stored}) == {"uuid": NODE, **node_values()}


def test_the_node_uuid_binds_in_its_canonical_form() -> None:
    secrets = NodeSecrets(keyring(("a", KEY_A)))
    stored = secrets.seal(NODE.upper(), node_values())  # a caller may write the uuid in capitals
    assert secrets.open({"uuid": NODE, **stored})["driver_info"] == node_values()["driver_info"]


def test_a_sealed_value_moved_to_another_node_or_key_does_not_open() -> None:
    secrets = NodeSecrets(keyring(("a", KEY_A)))
    password = secrets.seal(NODE, node_values())["driver_info"]["redfish_password"]
    with pytest.raises(errors.SecretUnreadable, match=f"node {OTHER} driver_info.redfish_password"):
        secrets.open({"uuid": OTHER, "driver_info": {"redfish_password": password}})
    with pytest.raises(errors.SecretUnreadable):
        secrets.open({"uuid": NODE, "driver_info": {"ipmi_password": password}})


def test_plaintext_rows_still_read_and_no_key_changes_nothing() -> None:
    secrets = NodeSecrets(keyring(("a", KEY_A)))
    assert secrets.open({"uuid": NODE, **node_values()}) == {"uuid": NODE, **node_values()}
    off = NodeSecrets(Keyring())
    assert off.seal(NODE, node_values()) == node_values()
    sealed = secrets.seal(NODE, node_values())
    with pytest.raises(errors.SecretUnreadable, match="no secret key is configured"):
        off.open({"uuid": NODE, **sealed})


def test_ciphertext_shaped_input_is_refused_under_secret_keys_only() -> None:
    planted = {"driver_info": {"redfish_password": PREFIX + "a:AAAA"}}
    for secrets in (NodeSecrets(keyring(("a", KEY_A))), NodeSecrets(Keyring())):
        with pytest.raises(errors.InvalidParameterValue, match=r"driver_info\.redfish_password may not start"):
            secrets.seal(NODE, planted)
    # Under an ordinary key it is just a string, stored and read back as it is.
    secrets = NodeSecrets(keyring(("a", KEY_A)))
    harmless = {"driver_info": {"note": PREFIX + "a:AAAA"}}
    assert secrets.open({"uuid": NODE, **secrets.seal(NODE, harmless)})["driver_info"] == harmless["driver_info"]


def test_needs_reseal_tells_what_rotation_must_rewrite() -> None:
    old = NodeSecrets(keyring(("a", KEY_A)))
    rotated = NodeSecrets(keyring(("b", KEY_B), ("a", KEY_A)))
    under_a = {"uuid": NODE, **old.seal(NODE, node_values())}
    assert not old.needs_reseal(under_a)
    assert rotated.needs_reseal(under_a)
    assert rotated.needs_reseal({"uuid": NODE, **node_values()})  # plaintext secrets
    under_b: dict[str, Any] = {"uuid": NODE, **rotated.reseal(under_a)}
    assert not rotated.needs_reseal(under_b)
    assert sealed_key_id(under_b["driver_info"]["redfish_password"]) == "b"
    only_b = NodeSecrets(keyring(("b", KEY_B)))
    assert only_b.open(under_b)["driver_info"] == node_values()["driver_info"]
