// The translation page: loads an ONNX export (vanilla-export-onnx) with transformers.js from the server that serves
// this page, and translates as the user types, drawing the last decoder layer's cross-attention. Nothing is fetched
// from elsewhere: the library, ONNX Runtime's WebAssembly and the model all come from the same server.
//
// ?model=NAME picks the folder under models/ (default: model); ?dtype=q8 the int8 graphs.
import { AutoModelForSeq2SeqLM, AutoTokenizer, env } from "./node_modules/@huggingface/transformers/dist/transformers.js";

const query = new URLSearchParams(location.search);
const modelName = query.get("model") ?? "model";
const dtype = query.get("dtype") ?? "fp32";
env.allowRemoteModels = false;
env.allowLocalModels = true;
// a path, not a URL: transformers.js looks for local files only at paths, and takes a URL for a remote model
env.localModelPath = new URL("models/", location.href).pathname;
env.backends.onnx.wasm.wasmPaths = new URL("node_modules/onnxruntime-web/dist/", location.href).href;
env.backends.onnx.wasm.numThreads = 1; // threads need a cross-origin isolated page, which a plain server is not

const source = document.getElementById("source");
const status = document.getElementById("status");
const translation = document.getElementById("translation");
const attention = document.getElementById("attention");

const [tokenizer, model, generation] = await Promise.all([
  AutoTokenizer.from_pretrained(modelName),
  AutoModelForSeq2SeqLM.from_pretrained(modelName, { dtype }),
  fetch(`${env.localModelPath}${modelName}/generation_config.json`).then((response) => response.json()),
]);
// Section 6.1's limit: source length + 50 tokens, </s> included
const margin = generation.max_new_tokens_over_source ?? null;

async function translate(text) {
  const inputs = tokenizer(text);
  const sourceLength = inputs.input_ids.dims[1];
  const limit = Math.min(margin === null ? generation.max_length : sourceLength + margin, generation.max_length) - 1;
  const output = await model.generate({
    ...inputs, max_new_tokens: limit, output_attentions: true, return_dict_in_generate: true,
  });
  const ids = Array.from(output.sequences.tolist()[0], Number);
  return {
    text: tokenizer.decode(ids, { skip_special_tokens: true }),
    sourceTokens: Array.from(inputs.input_ids.tolist()[0], (id) => tokenizer.decode([Number(id)])),
    targetTokens: ids.slice(1).map((id) => tokenizer.decode([id])),
    // per step, the last layer's weights (1, heads, 1, source length), averaged over the heads
    weights: output.cross_attentions.map((layers) => headMean(layers.at(-1))),
  };
}

function headMean(tensor) {
  const [, heads, , length] = tensor.dims;
  const data = tensor.data;
  return Array.from({ length }, (_, k) => {
    let sum = 0;
    for (let h = 0; h < heads; h++) sum += data[h * length + k];
    return sum / heads;
  });
}

function draw({ sourceTokens, targetTokens, weights }) {
  attention.replaceChildren();
  attention.style.gridTemplateColumns = `auto repeat(${sourceTokens.length}, auto)`;
  const cell = (text, className, weight) => {
    const span = document.createElement("span");
    span.textContent = text;
    span.className = className;
    if (weight !== undefined) {
      span.style.background = `rgba(37, 99, 235, ${weight.toFixed(3)})`;
      span.style.color = weight > 0.5 ? "white" : "#222";
      span.title = weight.toFixed(3);
      span.dataset.weight = weight;
    }
    attention.append(span);
  };
  cell("", "label");
  sourceTokens.forEach((token) => cell(token, "label source"));
  targetTokens.forEach((token, step) => {
    cell(token, "label target");
    weights[step].forEach((weight) => cell("", "weight", weight));
  });
}

let latest = 0;
async function update() {
  const text = source.value.trim();
  const call = ++latest;
  if (!text) {
    translation.textContent = "";
    attention.replaceChildren();
    return;
  }
  status.textContent = "Translating…";
  const result = await translate(text);
  if (call !== latest) return; // a newer keystroke's translation is under way
  translation.textContent = result.text;
  draw(result);
  status.textContent = "Translated.";
}

let timer;
source.addEventListener("input", () => {
  clearTimeout(timer);
  timer = setTimeout(update, 250);
});
source.disabled = false;
status.textContent = "Ready.";
document.body.dataset.ready = "true";
if (source.value) update();
