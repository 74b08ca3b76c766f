// Package grammar constrains generated text to a grammar: a JSON schema, free JSON, a regular
// expression, a list of choices, the V4 DSML tool-call block (CompileToolCalls) or a GBNF
// grammar (llama.cpp's EBNF dialect) compiles to one byte-level grammar, and a Matcher
// computes, per decoding step, the bitmask of vocabulary tokens that keep the output inside it.
//
// # Matching
//
// A compiled Grammar is a set of rules whose terminals are byte sets (character classes become
// alternatives of UTF-8 byte ranges). It is matched by a pushdown automaton built lazily: a
// parse stack is a list of grammar positions, a state is the set of all stacks alive after the
// bytes so far (so ambiguous grammars need no backtracking), and the transitions state x byte
// are computed once and cached in the Grammar.
//
// The token mask of a state is the union of its stacks' masks, and a stack's mask splits as in
// xgrammar: its top three frames (e.g. inside a JSON string: the character, the repetition, the
// closing quote) with an unknown rest below decide most tokens alone. One pass over the
// vocabulary's byte trie (TokenTable), skipping every subtree those frames reject, yields the
// tokens they accept whatever lies below, and the few uncertain tokens that run past the
// frames (`abc",` inside a string); only those are then walked against the real caller. These
// local masks are cached per Grammar and, keyed by a hash of the rules they can reach, in the
// TokenTable for all grammars: the string, number and value rules of every JSON grammar share
// them. Whole-state masks are cached too, so a state reached again costs one copy. Caches are
// bounded in entries. Left-recursive rules are rejected at compile time; Limits bound the
// grammar size, the states and the compile time, so adversarial input fails with an error
// instead of hanging or exhausting memory.
//
// # JSON layout
//
// Like OpenAI's strict structured outputs, JSON output has no free whitespace: one compact,
// deterministic layout, `{"a":1,"b":[true,null]}`, with properties in the order the schema
// lists them, strings with only the required escapes (\" \\ and control characters; \uXXXX
// escapes, surrogates excluded, are accepted), numbers as JSON numbers. A constrained model
// cannot spend tokens on whitespace, and a sampled output is one of few spellings of a value.
// CompileJSONSchemaLayout with Python gives json.dumps' separators (", " and ": ") instead, the
// layout the V4 chat encoding uses for non-string DSML tool-call parameters.
//
// Schema semantics: properties absent from `required` are optional; additionalProperties
// absent means none when properties are listed (strict mode) and any when none are;
// additional properties come after the listed ones and their names are not checked against
// them. oneOf is compiled as anyOf (exclusivity is not enforced); allOf only with one schema.
// Integer bounds are exact; number bounds must be integral and inclusive (fractions allowed,
// no exponent). Formats date, time, date-time (RFC 3339, leap years included), uuid, email,
// ipv4, hostname and uri are supported; patterns use the subset of CompileRegex with
// JSON-schema search semantics (unanchored sides match anything). Keywords the compiler cannot
// express (not, if/then/else, patternProperties, uniqueItems, multipleOf, ...) are errors
// (SchemaError, with the JSON pointer of the keyword) rather than silently ignored.
//
// # Use in the engine
//
//	table, _ := grammar.NewTokenTable(vocab, eosIDs)  // once per tokenizer: vocab[id] = token bytes
//	g, err := grammar.CompileJSONSchema(schema)       // per request (or cached per schema); err -> 400
//	m, _ := grammar.NewMatcher(g, table)              // per sequence (n > 1: one each)
//	mask := make([]uint32, table.MaskWords())
//	for !m.IsTerminated() {
//		m.FillMask(mask)         // before sampling: disallowed logits to -inf (or upload the mask)
//		tok := sample(logits, mask)
//		m.Accept(tok)            // error = the token is outside the grammar
//	}
//
// Speculative (MTP) drafts: Accept each draft token in turn and stop at the first error (that
// draft and the ones after it are rejected); after verification, Rollback(k) removes the k
// accepted draft tokens the target model did not confirm. Special tokens (empty bytes in the
// table) are never allowed; EOS only where the grammar can end. With reasoning, start the
// Matcher after the thinking block ends.
//
// On a GPU the engine does not bring the logits back for a constrained token: the mask goes up
// with the draw's parameters and the sample kernel reads a disallowed token as -inf before
// greedy, top-k, top-p and min-p (backend.Draw.Mask).
//
// # Jump-forward
//
// ForcedBytes returns the bytes every continuation starts with (`","name":"` after a value). The
// engine (engine.Constraint.Head) tokenizes them with the tokenizer's EncodeHead, Accepts the
// ids and appends them without sampling; they reach the model as a prefill chunk together with
// the next sampled token, so a forced key costs one step instead of one per token. Only the
// head is taken: every pre-tokenized piece but the last, because the last piece may merge with
// what follows (`":"` then a value's first letters can be one token) and is left to the model,
// under the mask. Tokenization is not otherwise guaranteed canonical: a pre-tokenizer whose
// regex alternatives match longer with more text could move an earlier piece boundary too; the
// output stays inside the grammar either way (each id is Accepted), only the split the model
// conditions on would be unusual. Requests with logprobs get no jump-forward (forced tokens
// have no logprobs), and it stops at a token the table lacks (a special token) or a stop token.
//
// Semantics: the forced text is what masked sampling would produce too (the grammar allows no
// other bytes there), but its split is the tokenizer's instead of the model's choice among the
// spellings of the same bytes, and it draws no random numbers, so a seeded request gives
// another (equally valid) output than without jump-forward. The tokens after it are sampled
// from the masked distribution as usual. vLLM (xgrammar or guidance backends) has no
// jump-forward: every token is a masked sample and a decode step. SGLang's jump-forward
// re-tokenizes the forced text with the preceding output and may rewrite emitted tokens; here
// emitted tokens are never rewritten, the boundary piece is held back instead.
//
// Errors: compile errors are the client's (a 400; SchemaError carries the JSON pointer).
// FillMask, Accept and ForcedBytes can still return ErrLimit on a pathologically ambiguous
// grammar (too many states or parses, or more than Limits.MaxWork expansions in one call): end
// that sequence with an error rather than sampling without the constraint.
//
// Costs: compiling a schema takes well under a millisecond; the first mask of a state that
// needs a full trie pass (most tokens allowed, as inside the first JSON string ever seen by a
// TokenTable) takes milliseconds, later ones microseconds. An engine should therefore keep one
// TokenTable per tokenizer, cache compiled Grammars by schema (the API keeps the 64 most recent)
// and may warm the table at start
// (compile CompileJSON(false) and fill a few masks inside a string and a number).
//
// A Grammar and a TokenTable are safe for concurrent use (each takes a mutex while its caches
// grow); a Matcher is not.
package grammar
