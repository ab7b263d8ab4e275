-- REST 1.60: the project that owns an allocation (Ironic's Allocation.owner, String(255)).
ALTER TABLE allocations ADD COLUMN owner text CHECK (owner IS NULL OR length(owner) <= 255);
CREATE INDEX allocations_owner_idx ON allocations (owner) WHERE owner IS NOT NULL;
