import { testConformance } from "./conformance/deno.ts";
import { postgresJsHarness } from "./sql/harness.ts";

testConformance(postgresJsHarness);
