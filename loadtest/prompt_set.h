// The load generator's built-in prompt set: chat requests of varied length and kind (short
// questions, explanations, rewriting and summarising a given passage, code, lists), so a load
// test sees the prompt lengths and draft acceptance of real traffic rather than random tokens.
#ifndef SPECD_LOADTEST_PROMPT_SET_H_
#define SPECD_LOADTEST_PROMPT_SET_H_

#include <string>
#include <vector>

namespace specd::loadtest {

// User turns, shortest first; each is sent as one chat message.
const std::vector<std::string>& BuiltinPrompts();

// Editing traffic: each asks for a given text or program back with a small change (fix typos,
// rename, add a line), so most of the answer copies the prompt, as in code-editing assistants.
const std::vector<std::string>& EditPrompts();

}  // namespace specd::loadtest

#endif  // SPECD_LOADTEST_PROMPT_SET_H_
