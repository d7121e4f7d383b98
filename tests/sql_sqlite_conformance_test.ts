import { testConformance } from "./conformance/deno.ts";
import { sqliteHarness } from "./sql/harness.ts";

testConformance(sqliteHarness);
