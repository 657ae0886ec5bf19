CREATE TABLE "cache_invalidations" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"app_id" uuid NOT NULL,
	"app" boolean NOT NULL,
	"license_keys" text[] NOT NULL,
	"noted_at" timestamp (3) with time zone DEFAULT now() NOT NULL
);
