-- Ferrum initial schema. Forward-only: later changes go in new files.

CREATE TABLE conductors (
    id              bigserial PRIMARY KEY,
    hostname        text NOT NULL UNIQUE CHECK (length(hostname) BETWEEN 1 AND 255),
    grpc_address    text NOT NULL,
    conductor_group text NOT NULL DEFAULT '',
    hardware_types  text[] NOT NULL DEFAULT '{}',
    interfaces      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(interfaces) = 'object'),
    online          boolean NOT NULL DEFAULT true,
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    id                      bigserial PRIMARY KEY,
    uuid                    uuid NOT NULL UNIQUE,
    name                    text UNIQUE CHECK (name IS NULL OR length(name) BETWEEN 1 AND 255),
    driver                  text NOT NULL,
    boot_interface          text,
    deploy_interface        text,
    power_interface         text,
    management_interface    text,
    storage_interface       text,
    network_interface       text,
    vendor_interface        text,
    inspect_interface       text,
    console_interface       text,
    raid_interface          text,
    rescue_interface        text,
    bios_interface          text,
    firmware_interface      text,
    driver_info             jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(driver_info) = 'object'),
    driver_internal_info    jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(driver_internal_info) = 'object'),
    instance_info           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(instance_info) = 'object'),
    properties              jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(properties) = 'object'),
    extra                   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    network_data            jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(network_data) = 'object'),
    raid_config             jsonb NOT NULL DEFAULT '{}',
    target_raid_config      jsonb NOT NULL DEFAULT '{}',
    clean_step              jsonb NOT NULL DEFAULT '{}',
    deploy_step             jsonb NOT NULL DEFAULT '{}',
    service_step            jsonb NOT NULL DEFAULT '{}',
    traits                  text[] NOT NULL DEFAULT '{}',
    provision_state         text NOT NULL,
    target_provision_state  text,
    provision_updated_at    timestamptz,
    power_state             text,
    target_power_state      text,
    boot_mode               text,
    secure_boot             boolean,
    maintenance             boolean NOT NULL DEFAULT false,
    maintenance_reason      text,
    fault                   text,
    last_error              text,
    reservation             text,
    reservation_expires_at  timestamptz,
    conductor_group         text NOT NULL DEFAULT '' CHECK (length(conductor_group) <= 255),
    resource_class          text CHECK (resource_class IS NULL OR length(resource_class) <= 80),
    instance_uuid           uuid UNIQUE,
    owner                   text,
    lessee                  text,
    automated_clean         boolean,
    protected               boolean NOT NULL DEFAULT false,
    protected_reason        text,
    retired                 boolean NOT NULL DEFAULT false,
    retired_reason          text,
    description             text CHECK (description IS NULL OR length(description) <= 4096),
    inspection_started_at   timestamptz,
    inspection_finished_at  timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz,
    CHECK (reservation IS NULL OR reservation_expires_at IS NOT NULL)
);
CREATE INDEX nodes_provision_state_idx ON nodes (provision_state);
CREATE INDEX nodes_driver_idx ON nodes (driver);
CREATE INDEX nodes_conductor_group_idx ON nodes (conductor_group);
CREATE INDEX nodes_reservation_idx ON nodes (reservation) WHERE reservation IS NOT NULL;

-- Ports belong to their node: deleting a node deletes its ports (as Ironic does).
CREATE TABLE ports (
    id                      bigserial PRIMARY KEY,
    uuid                    uuid NOT NULL UNIQUE,
    node_id                 bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    address                 text NOT NULL UNIQUE CHECK (address ~ '^([0-9a-f]{2}:){5}[0-9a-f]{2}$'),
    name                    text UNIQUE,
    pxe_enabled             boolean NOT NULL DEFAULT true,
    extra                   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    internal_info           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(internal_info) = 'object'),
    local_link_connection   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(local_link_connection) = 'object'),
    physical_network        text,
    is_smartnic             boolean NOT NULL DEFAULT false,
    description             text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz
);
CREATE INDEX ports_node_id_idx ON ports (node_id);

-- Volume records describe a node's boot-from-volume setup and go with the node.
CREATE TABLE volume_connectors (
    id              bigserial PRIMARY KEY,
    uuid            uuid NOT NULL UNIQUE,
    node_id         bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    type            text NOT NULL CHECK (length(type) BETWEEN 1 AND 32),
    connector_id    text NOT NULL CHECK (length(connector_id) BETWEEN 1 AND 255),
    extra           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz,
    UNIQUE (type, connector_id)
);
CREATE INDEX volume_connectors_node_id_idx ON volume_connectors (node_id);

CREATE TABLE volume_targets (
    id              bigserial PRIMARY KEY,
    uuid            uuid NOT NULL UNIQUE,
    node_id         bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    volume_type     text NOT NULL CHECK (length(volume_type) BETWEEN 1 AND 64),
    boot_index      integer NOT NULL CHECK (boot_index >= 0),
    volume_id       text NOT NULL CHECK (length(volume_id) BETWEEN 1 AND 255),
    properties      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(properties) = 'object'),
    extra           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz,
    UNIQUE (node_id, boot_index)
);

-- Per-node audit trail (REST /history); it is part of the node and goes with it.
CREATE TABLE node_history (
    id              bigserial PRIMARY KEY,
    uuid            uuid NOT NULL UNIQUE,
    node_id         bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    conductor       text,
    event_type      text NOT NULL,
    event           text NOT NULL,
    severity        text NOT NULL CHECK (severity IN ('INFO', 'WARNING', 'ERROR')),
    user_id         text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX node_history_node_id_idx ON node_history (node_id, id);

-- The change feed behind WatchNodes. Deliberately no foreign key: watchers
-- must also see a node's deletion, so events outlive the node row.
CREATE TABLE node_events (
    sequence                bigserial PRIMARY KEY,
    node_uuid               uuid NOT NULL,
    event                   text NOT NULL,
    provision_state         text,
    target_provision_state  text,
    power_state             text,
    severity                text NOT NULL DEFAULT 'INFO',
    message                 text NOT NULL DEFAULT '',
    conductor               text,
    created_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX node_events_node_uuid_idx ON node_events (node_uuid, sequence);

CREATE FUNCTION notify_node_event() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('ferrum_node_events', NEW.sequence::text);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER node_events_notify AFTER INSERT ON node_events
    FOR EACH ROW EXECUTE FUNCTION notify_node_event();

-- Object store metadata (the bytes live on a filesystem or in S3).
CREATE TABLE objects (
    id              bigserial PRIMARY KEY,
    container       text NOT NULL CHECK (length(container) BETWEEN 1 AND 255),
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    size            bigint NOT NULL CHECK (size >= 0),
    sha256          text NOT NULL,
    content_type    text NOT NULL DEFAULT 'application/octet-stream',
    backend_key     text NOT NULL,
    delete_at       timestamptz,
    usage_count     bigint NOT NULL DEFAULT 0 CHECK (usage_count >= 0),
    metadata        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz,
    UNIQUE (container, name)
);
CREATE INDEX objects_delete_at_idx ON objects (delete_at) WHERE delete_at IS NOT NULL;
