import { testConformance } from "./conformance/deno.ts";
import { sqliteHarness, sqliteWorkerHarness } from "./sql/harness.ts";

testConformance(sqliteHarness);
testConformance(sqliteWorkerHarness);
