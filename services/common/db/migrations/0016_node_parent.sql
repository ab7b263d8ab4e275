-- Child nodes (Ironic's nodes.parent_node, API 1.83): the UUID of the node this
-- one is part of (a BMC inside a machine, say). No foreign key, as in Ironic:
-- the API checks the parent exists when the link is made. Indexed for the
-- children list and for hiding children from the node list.
ALTER TABLE nodes ADD COLUMN parent_node text CHECK (char_length(parent_node) <= 36);
CREATE INDEX nodes_parent_node ON nodes (parent_node);
