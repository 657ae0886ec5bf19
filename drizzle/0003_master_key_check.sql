CREATE TABLE "master_key_check" (
	"id" smallint PRIMARY KEY DEFAULT 1 NOT NULL,
	"value" text NOT NULL,
	"updated_at" timestamp (3) with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "master_key_check_one_row" CHECK ("master_key_check"."id" = 1)
);
