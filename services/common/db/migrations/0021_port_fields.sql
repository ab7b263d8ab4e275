-- Port and port group fields of API 1.97 to 1.111, Ironic's sizes.
-- ports.description already exists (0001). available_for_dynamic_portgroup
-- (1.111) is the operator's say on whether a port may be bonded dynamically;
-- portgroups.dynamic_portgroup is read-only through the API (false unless a
-- port group was made by dynamic bonding, which Ferrum does not do).
ALTER TABLE ports ADD COLUMN vendor text CHECK (char_length(vendor) <= 32);
ALTER TABLE ports ADD COLUMN category text CHECK (char_length(category) <= 80);
ALTER TABLE ports ADD COLUMN available_for_dynamic_portgroup boolean NOT NULL DEFAULT true;
ALTER TABLE portgroups ADD COLUMN physical_network text CHECK (char_length(physical_network) <= 64);
ALTER TABLE portgroups ADD COLUMN category text CHECK (char_length(category) <= 80);
ALTER TABLE portgroups ADD COLUMN dynamic_portgroup boolean NOT NULL DEFAULT false;
