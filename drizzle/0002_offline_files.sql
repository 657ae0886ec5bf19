CREATE TABLE "offline_files" (
	"id" uuid PRIMARY KEY NOT NULL,
	"license_key" text NOT NULL,
	"app_id" uuid NOT NULL,
	"key_id" text NOT NULL,
	"issued_at" timestamp (3) with time zone NOT NULL,
	"expires_at" timestamp (3) with time zone,
	"hwid" jsonb NOT NULL
);
--> statement-breakpoint
ALTER TABLE "offline_files" ADD CONSTRAINT "offline_files_license_key_licenses_key_fk" FOREIGN KEY ("license_key") REFERENCES "public"."licenses"("key") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "offline_files" ADD CONSTRAINT "offline_files_app_id_apps_id_fk" FOREIGN KEY ("app_id") REFERENCES "public"."apps"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "offline_files_license_idx" ON "offline_files" USING btree ("license_key","issued_at");