-- Exact invalidation for the api's knowledge of which node documents are
-- current (services/api/fresh_nodes.py): every committed change to a node row
-- (any column: the document shows nearly all of them) and to which allocation
-- holds a node sends NOTIFY ferrum_node_changes with the node's uuid, by
-- trigger, so every service's writes and direct SQL are covered alike. An
-- empty payload (TRUNCATE) means "every node".

CREATE FUNCTION notify_node_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('ferrum_node_changes', '');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('ferrum_node_changes', OLD.uuid::text);
    ELSE
        PERFORM pg_notify('ferrum_node_changes', NEW.uuid::text);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER nodes_changes AFTER UPDATE OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION notify_node_change();
CREATE TRIGGER nodes_changes_truncate AFTER TRUNCATE ON nodes
    FOR EACH STATEMENT EXECUTE FUNCTION notify_node_change();

-- An allocation's uuid is part of its node's document (allocation_uuid, 1.52):
-- the node it held and the node it holds now.
CREATE FUNCTION notify_allocation_node_change() RETURNS trigger AS $$
DECLARE
    owners bigint[] := '{}';
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.node_id IS NOT NULL THEN
        owners := owners || OLD.node_id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.node_id IS NOT NULL THEN
        owners := owners || NEW.node_id;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.node_id IS NOT DISTINCT FROM NEW.node_id AND OLD.uuid = NEW.uuid THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('ferrum_node_changes', n.uuid::text) FROM nodes n WHERE n.id = ANY(owners);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER allocations_node_changes AFTER INSERT OR UPDATE OR DELETE ON allocations
    FOR EACH ROW EXECUTE FUNCTION notify_allocation_node_change();
