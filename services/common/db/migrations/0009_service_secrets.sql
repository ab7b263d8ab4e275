-- Secrets Ferrum generates once and every process shares (the temp-URL HMAC
-- key, the internal gRPC token): one table for all of them, not the object
-- store's alone.
ALTER TABLE objectstore_secrets RENAME TO service_secrets;
