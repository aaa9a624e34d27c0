# Runs inside `sluice-testkit run --pg`: SLUICE_TEST_PG_URL points at the throwaway server.
set -euo pipefail
source scripts/lib/common.sh
DB="${SLUICE_TEST_PG_URL%/*}/demo"
psql -q "$SLUICE_TEST_PG_URL" -c "CREATE DATABASE demo"
say "loading $ROWS sample orders"
psql -q "$DB" <<SQL
CREATE TABLE public.orders (
    id          bigint PRIMARY KEY,
    customer_id int NOT NULL,
    amount      numeric(12,2) NOT NULL,
    status      text NOT NULL,
    created_at  timestamptz NOT NULL
);
INSERT INTO public.orders
SELECT g, 1 + (g * 7919) % 250000, ((g * 104729) % 1000000) / 100.0,
       (ARRAY['new','paid','shipped','delivered','returned'])[1 + g % 5],
       timestamptz '2024-01-01' + g * interval '7 seconds'
FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE public.orders;
SQL
OUT="$(mktemp -d /tmp/sluice-demo.XXXXXX)"
say "sluice plan"
"$SLUICE" plan --source "$DB" --table public.orders
say "sluice export → $OUT"
"$SLUICE" export --source "$DB" --table public.orders --to "$OUT" --report-json "$OUT/report.json"
say "files written"
ls -l "$OUT" "$OUT/public.orders"
echo "manifest: $OUT/manifest.json   report: $OUT/report.json"
