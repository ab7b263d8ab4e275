-- Exact invalidation for the iPXE renderer's cache: every change to what a
-- boot script is rendered from (services/common/db/bootdata.py reads these
-- columns and tables) sends NOTIFY ferrum_boot_data with the node's uuid, by
-- trigger, so direct SQL and every service's writes are covered alike.
-- Renderers evict that node's entries (and every cached "not found").
-- Keep the column list in step with bootdata._COLUMNS.

CREATE FUNCTION notify_boot_data_node() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('ferrum_boot_data', OLD.uuid::text);
    ELSE
        PERFORM pg_notify('ferrum_boot_data', NEW.uuid::text);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER nodes_boot_data_insert_delete AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION notify_boot_data_node();

CREATE TRIGGER nodes_boot_data_update AFTER UPDATE ON nodes
    FOR EACH ROW WHEN (
        OLD.uuid IS DISTINCT FROM NEW.uuid OR OLD.name IS DISTINCT FROM NEW.name
        OR OLD.driver IS DISTINCT FROM NEW.driver OR OLD.boot_interface IS DISTINCT FROM NEW.boot_interface
        OR OLD.deploy_interface IS DISTINCT FROM NEW.deploy_interface
        OR OLD.storage_interface IS DISTINCT FROM NEW.storage_interface
        OR OLD.driver_info IS DISTINCT FROM NEW.driver_info
        OR OLD.driver_internal_info IS DISTINCT FROM NEW.driver_internal_info
        OR OLD.instance_info IS DISTINCT FROM NEW.instance_info OR OLD.properties IS DISTINCT FROM NEW.properties
        OR OLD.provision_state IS DISTINCT FROM NEW.provision_state
        OR OLD.target_provision_state IS DISTINCT FROM NEW.target_provision_state
        OR OLD.boot_mode IS DISTINCT FROM NEW.boot_mode)
    EXECUTE FUNCTION notify_boot_data_node();

-- Ports, volume targets and connectors: the owning node's uuid (both owners
-- when a row moves). A row deleted by its node's cascade finds no node; the
-- node's own DELETE has notified already.
CREATE FUNCTION notify_boot_data_child() RETURNS trigger AS $$
DECLARE
    owners bigint[] := '{}';
BEGIN
    IF TG_OP <> 'INSERT' THEN
        owners := owners || OLD.node_id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        owners := owners || NEW.node_id;
    END IF;
    PERFORM pg_notify('ferrum_boot_data', n.uuid::text) FROM nodes n WHERE n.id = ANY(owners);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER ports_boot_data AFTER INSERT OR UPDATE OR DELETE ON ports
    FOR EACH ROW EXECUTE FUNCTION notify_boot_data_child();
CREATE TRIGGER volume_targets_boot_data AFTER INSERT OR UPDATE OR DELETE ON volume_targets
    FOR EACH ROW EXECUTE FUNCTION notify_boot_data_child();
CREATE TRIGGER volume_connectors_boot_data AFTER INSERT OR UPDATE OR DELETE ON volume_connectors
    FOR EACH ROW EXECUTE FUNCTION notify_boot_data_child();
