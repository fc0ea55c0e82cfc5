// Translate standard input, a sentence a line, with transformers.js in Node from a folder written by
// vanilla-export-onnx, offline: the check that transformers.js reads the export as the Python side does.
//
//     node demo/web/translate.mjs runs/multi30k-small-onnx [fp32|q8] < sentences.en > sentences.de
//
// Greedy (transformers.js has no beam search), a sentence at a time, each within Section 6.1's limit: its source
// length + the folder's max_new_tokens_over_source tokens, </s> included (so one fewer new token before it).
import { readFileSync } from "node:fs";
import path from "node:path";
import { AutoModelForSeq2SeqLM, AutoTokenizer, env } from "@huggingface/transformers";

const [folder, dtype = "fp32"] = process.argv.slice(2);
if (!folder) {
  console.error("usage: node translate.mjs ONNX_FOLDER [fp32|q8] < sentences");
  process.exit(2);
}
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(folder));
const name = path.basename(path.resolve(folder));
const generation = JSON.parse(readFileSync(path.join(folder, "generation_config.json"), "utf8"));
const margin = generation.max_new_tokens_over_source ?? null;

const tokenizer = await AutoTokenizer.from_pretrained(name);
const model = await AutoModelForSeq2SeqLM.from_pretrained(name, { dtype });
const lines = readFileSync(0, "utf8").split("\n");
if (lines.at(-1) === "") lines.pop();
for (const line of lines) {
  if (line.trim() === "") {
    console.log("");
    continue;
  }
  const inputs = tokenizer(line);
  const sourceLength = inputs.input_ids.dims[1];
  const limit = Math.min(margin === null ? generation.max_length : sourceLength + margin, generation.max_length) - 1;
  const output = await model.generate({ ...inputs, max_new_tokens: limit });
  console.log(tokenizer.decode(output[0], { skip_special_tokens: true }));
}
