-- migrate:up
-- Receipts from two more providers' signed callbacks: Postmark's delivery, bounce and spam-complaint
-- webhooks ('postmark') and Amazon SES events delivered through an SNS topic ('ses', the SNS message's
-- signature verified). The receiver verifies each source before a row is written; the column lists
-- the sources it can verify, so a receipt of any other provenance cannot be recorded by any role.
ALTER TABLE delivery_receipt DROP CONSTRAINT delivery_receipt_source_check;
ALTER TABLE delivery_receipt ADD CONSTRAINT delivery_receipt_source_check
    CHECK (source IN ('standard-webhooks', 'twilio', 'postmark', 'ses'));

-- migrate:down
ALTER TABLE delivery_receipt DROP CONSTRAINT delivery_receipt_source_check;
ALTER TABLE delivery_receipt ADD CONSTRAINT delivery_receipt_source_check
    CHECK (source IN ('standard-webhooks', 'twilio'));
