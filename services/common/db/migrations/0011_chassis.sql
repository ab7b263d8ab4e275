-- Chassis (REST 1.1): a record that groups nodes. A node names its chassis by
-- UUID; a chassis that still holds nodes cannot be deleted (Ironic's
-- ChassisNotEmpty), which the RESTRICT foreign key enforces.
CREATE TABLE chassis (
    id          bigserial PRIMARY KEY,
    uuid        uuid NOT NULL UNIQUE,
    description text CHECK (description IS NULL OR length(description) <= 255),
    extra       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz
);

ALTER TABLE nodes ADD COLUMN chassis_uuid uuid REFERENCES chassis (uuid) ON DELETE RESTRICT ON UPDATE CASCADE;
CREATE INDEX nodes_chassis_uuid_idx ON nodes (chassis_uuid) WHERE chassis_uuid IS NOT NULL;
