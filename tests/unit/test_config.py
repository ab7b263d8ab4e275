import dataclasses

import pytest

from services.common.config import ConfigError, load_settings, option_env_names


def test_env_and_toml_layers(tmp_path):
    path = tmp_path / "ferrum.toml"
    path.write_text(
        'log_level = "DEBUG"\n[api]\nport = 7000\nmax_limit = 50\n[conductor]\nenabled_hardware_types = ["fake-hardware"]\n'
    )
    settings = load_settings({"FERRUM_API_PORT": "7001"}, config_file=str(path))
    assert settings.api.port == 7001  # environment wins over the file
    assert settings.api.max_limit == 50
    assert settings.log_level == "DEBUG"
    assert settings.conductor.enabled_hardware_types == ("fake-hardware",)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"FERRUM_API_PORTT": "1"}, "unknown environment variable FERRUM_API_PORTT"),
        ({"FERRUM_API_PORT": "x"}, "expected an integer"),
        ({"FERRUM_API_PORT": "70000"}, "between 0 and 65535"),
        ({"FERRUM_DATABASE_URL": "mysql://h/db"}, "is not a PostgreSQL URL"),
        ({"FERRUM_DATABASE_URL": "postgresql://h:notaport/db"}, "invalid port"),
        ({"FERRUM_API_AUTH_STRATEGY": "keystone"}, "noauth or http_basic"),
        ({"FERRUM_IPXE_CACHE_TTL": "-1"}, "CACHE_TTL must be >= 0"),
        ({"FERRUM_IPXE_CACHE_MAX_ENTRIES": "0"}, "CACHE_MAX_ENTRIES must be >= 1"),
        ({"FERRUM_API_HTTP_MAX_CONNECTIONS": "0"}, "FERRUM_API_HTTP_MAX_CONNECTIONS must be at least 1"),
        ({"FERRUM_IPXE_HTTP_HEADER_TIMEOUT": "0"}, "FERRUM_IPXE_HTTP_HEADER_TIMEOUT must be positive"),
        ({"FERRUM_OBJECTSTORE_HTTP_HEADER_TIMEOUT": "-1"}, "FERRUM_OBJECTSTORE_HTTP_HEADER_TIMEOUT must be positive"),
    ],
)
def test_bad_values_are_rejected(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


def test_unknown_toml_option(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[api]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown option \[api\] prot"):
        load_settings({}, config_file=str(path))


def test_settings_are_frozen():
    settings = load_settings({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.api.port = 1  # type: ignore[misc]


def test_every_option_has_one_env_name():
    names = option_env_names()
    assert names["FERRUM_DATABASE_URL"] == ("database", "url")
    assert names["FERRUM_STATE_DIR"] == (None, "state_dir")
    assert len(set(names.values())) == len(names)


def test_listener_bounds_have_defaults_per_listener():
    settings = load_settings({"FERRUM_IPXE_HTTP_MAX_CONNECTIONS": "20000"})
    assert settings.ipxe.http_max_connections == 20000  # a boot storm: one connection per machine
    assert (settings.api.http_max_connections, settings.objectstore.http_max_connections) == (4096, 4096)
    assert settings.api.http_header_timeout == settings.ipxe.http_header_timeout == 10.0


def test_a_cinder_section_sets_the_conductors_cinder_options(tmp_path):
    """Seed 004's [cinder] options, in a section of their own as Ironic writes them."""
    path = tmp_path / "ferrum.toml"
    path.write_text(
        "[cinder]\nurl = 'http://cinder.example:8776/v3'\nretries = 5\nauth_strategy = 'keystone'\n"
        "toggle_attachments_with_power = false\n[conductor]\nhostname = 'c1'\n"
    )
    conductor = load_settings({}, config_file=str(path)).conductor
    assert conductor.cinder_url == "http://cinder.example:8776/v3" and conductor.cinder_retries == 5
    assert conductor.cinder_auth_strategy == "keystone" and conductor.toggle_attachments_with_power is False
    assert conductor.hostname == "c1"
    path.write_text("[cinder]\nendpoint = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown option \[cinder\] endpoint"):
        load_settings({}, config_file=str(path))
    path.write_text("[cinder]\nauth_strategy = 'token'\n")
    with pytest.raises(ConfigError, match="cinder_auth_strategy must be noauth or keystone"):
        load_settings({}, config_file=str(path))
