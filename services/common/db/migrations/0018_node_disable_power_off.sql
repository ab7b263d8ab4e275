-- Ironic's nodes.disable_power_off (API 1.95): the machine must never be
-- powered off (a BMC that shares its power with something else); Ferrum
-- refuses power off and reboots where a flow would power off and on.
ALTER TABLE nodes ADD COLUMN disable_power_off boolean NOT NULL DEFAULT false;
