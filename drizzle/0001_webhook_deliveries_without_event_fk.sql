ALTER TABLE "webhook_deliveries" DROP CONSTRAINT "webhook_deliveries_event_id_events_id_fk";
