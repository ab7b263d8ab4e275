-- Firmware components a node's firmware interface read from its BMC (Ironic's
-- firmware_information table, API 1.86; vendor, model and serial_number are
-- shown from 1.114). One row per node and component ("bios", "bmc",
-- "nic:<serial or id>"); initial_version is the first version seen and stays.
CREATE TABLE firmware_components (
    id                   bigserial PRIMARY KEY,
    node_id              bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    component            text NOT NULL CHECK (char_length(component) <= 255),
    initial_version      text NOT NULL,
    current_version      text NOT NULL,
    last_version_flashed text,
    vendor               text,
    model                text,
    serial_number        text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz,
    UNIQUE (node_id, component)
);
