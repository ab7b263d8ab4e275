"""Masking as oslo.utils' mask_dict_password does it, plus URL credentials."""

from __future__ import annotations

import pytest

from services.common.secret_keys import OSLO_SANITIZE_KEYS
from services.common.secret_masking import MASK, mask_dict, mask_text


def test_every_oslo_key_is_masked_in_any_case_and_inside_longer_names() -> None:
    info = {f"my_{key.upper()}_1": "v" for key in OSLO_SANITIZE_KEYS}
    assert set(mask_dict(info).values()) == {MASK}


def test_nested_secrets_lists_and_urls() -> None:
    info = {
        "bmc": {"password": "pw", "username": "admin", "deeper": [{"auth_token": "t"}, "plain"]},
        "redfish_address": "https://10.0.0.1",
        "image_https_proxy": "http://proxyuser:proxypass@proxy.example:3128",
        "mirrors": ["https://mirror-token@mirror.example/path", "http://u:p@[fd00::1]:80/x?y=1"],
        "snmp_priv_key": "k",
        "ssh_key_contents": "-----BEGIN",
        "tokens": ["a", "b"],  # a secret key's list is replaced whole
        "password": "",  # unset stays visible as unset
        "agent_secret_token": None,
        "kernel_append_params": "console=ttyS0 ipa-agent-token=abc123 root_password = hunter2",
        "count": 3,
    }
    masked = mask_dict(info)
    assert masked == {
        "bmc": {"password": MASK, "username": "admin", "deeper": [{"auth_token": MASK}, "plain"]},
        "redfish_address": "https://10.0.0.1",
        "image_https_proxy": f"http://proxyuser:{MASK}@proxy.example:3128",
        "mirrors": [f"https://{MASK}@mirror.example/path", f"http://u:{MASK}@[fd00::1]:80/x?y=1"],
        "snmp_priv_key": MASK,
        "ssh_key_contents": MASK,
        "tokens": MASK,
        "password": "",
        "agent_secret_token": None,
        "kernel_append_params": f"console=ttyS0 ipa-agent-token={MASK} root_password = {MASK}",
        "count": 3,
    }
    assert info["bmc"] == {
        "password": "pw",
        "username": "admin",
        "deeper": [{"auth_token": "t"}, "plain"],
    }  # a copy: the stored value is untouched


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("download failed: http://user:pw@host/img: 404", f"download failed: http://user:{MASK}@host/img: 404"),
        ("https://host/image?X-Token=abc&part=2", f"https://host/image?X-Token={MASK}&part=2"),
        ("mailto-like a@b and no scheme", "mailto-like a@b and no scheme"),
        ("ssh://git@host/repo", f"ssh://{MASK}@host/repo"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_text(text: str, shown: str) -> None:
    assert mask_text(text) == shown
