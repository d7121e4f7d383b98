import { testConformance } from "./conformance/deno.ts";
import { pgHarness } from "./sql/harness.ts";

testConformance(pgHarness);
