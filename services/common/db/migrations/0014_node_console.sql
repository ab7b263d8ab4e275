-- Serial consoles (Ironic's node.console_enabled, PUT /v1/nodes/{id}/states/console):
-- whether the node's console is wanted. The conductor that owns the node runs a
-- proxy for each node marked here, and a conductor that adopts the nodes of a
-- dead one starts theirs again (docs/console.md). The partial index keeps that
-- scan cheap on a large fleet where few consoles are open.
ALTER TABLE nodes ADD COLUMN console_enabled boolean NOT NULL DEFAULT false;
CREATE INDEX nodes_console_enabled ON nodes (id) WHERE console_enabled;
