#include "loadtest/prompt_set.h"

namespace specd::loadtest {

namespace {

// A passage the rewrite and summary prompts quote: output that copies from the prompt is where
// n-gram drafting shines, as in retrieval-augmented and editing traffic.
constexpr char kPassage[] =
    "The lighthouse on the northern cape was built in 1872 from granite quarried on the island "
    "itself. For almost a century its keepers climbed one hundred and twelve steps every evening "
    "to light the lamp, which burned whale oil at first, then kerosene, and finally electricity "
    "after a cable reached the cape in 1951. The last keeper, a retired sailor named Tomas "
    "Ekberg, left in 1968 when the light was automated. Today the tower is a small museum: "
    "visitors can climb the same steps, read the keepers' logbooks, and on clear days see the "
    "coast of the mainland forty kilometres away. The museum is open from May to September, and "
    "the ferry from the harbour runs twice a day in summer.";

std::vector<std::string> Make() {
  std::vector<std::string> p = {
      "What is the capital of France?",
      "Name three primary colours.",
      "Give me a synonym for \"happy\".",
      "How many days are there in a leap year?",
      "Write a haiku about autumn rain.",
      "Explain in two sentences why the sky is blue.",
      "What is the difference between weather and climate?",
      "List five fruits that are rich in vitamin C.",
      "Write a short, friendly email inviting a colleague to lunch on Friday.",
      "Explain what a hash table is to a new programmer, with a simple example.",
      "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
      "Describe the water cycle step by step, from evaporation to collection.",
      "Give me a packing list for a three-day hiking trip in the mountains in early spring, "
      "grouped into clothing, food, and equipment.",
      "Compare trains and aeroplanes for a 500-kilometre journey: time, cost, comfort, and "
      "environmental impact. End with a recommendation.",
      "Write a short story of about one hundred words about a robot who learns to bake bread.",
  };
  const std::string passage = kPassage;
  p.push_back("Summarise the following text in two sentences.\n\n" + passage);
  p.push_back("Rewrite the following text in simpler English, keeping every fact.\n\n" + passage);
  p.push_back("Repeat the following text exactly, then list the years it mentions.\n\n" +
              passage);
  p.push_back("Answer from the text only: when was the light automated, and who was the last "
              "keeper?\n\n" + passage);
  p.push_back(
      "You are reviewing a colleague's plan. They want to move a small web service from one "
      "server to three servers behind a load balancer. The service keeps user sessions in "
      "memory, writes uploaded files to the local disk, and runs a cron job every night that "
      "cleans up old uploads. They plan to copy the code to the new servers, point the load "
      "balancer at them, and switch the DNS record on a Sunday morning. List the problems you "
      "see with this plan, and for each one suggest a concrete fix.");
  return p;
}

// A program the editing prompts hand back with a change.
constexpr char kProgram[] =
    "def load_orders(path):\n"
    "    orders = []\n"
    "    with open(path) as f:\n"
    "        for line in f:\n"
    "            fields = line.strip().split(\",\")\n"
    "            if len(fields) != 3:\n"
    "                continue\n"
    "            customer, item, amount = fields\n"
    "            orders.append({\"customer\": customer, \"item\": item, \"amount\": float(amount)})\n"
    "    return orders\n"
    "\n"
    "def total_by_customer(orders):\n"
    "    totals = {}\n"
    "    for order in orders:\n"
    "        totals[order[\"customer\"]] = totals.get(order[\"customer\"], 0) + order[\"amount\"]\n"
    "    return totals\n";

std::vector<std::string> MakeEdits() {
  const std::string passage = kPassage, program = kProgram;
  return {
      "Fix any spelling mistakes in the following text and return the whole text.\n\n" + passage,
      "Rename the function load_orders to read_orders everywhere in this code and return the "
      "complete code.\n\n" + program,
      "Add a one-line docstring to each function in this code and return the complete code.\n\n" +
          program,
      "Put each sentence of the following text on its own line, without changing any words.\n\n" +
          passage,
      "Change every year in the following text to words (1872 becomes eighteen seventy-two) "
      "and return the whole text.\n\n" + passage,
      "Add type hints to this code and return the complete code.\n\n" + program,
  };
}

}  // namespace

const std::vector<std::string>& EditPrompts() {
  static const std::vector<std::string>* prompts = new std::vector<std::string>(MakeEdits());
  return *prompts;
}

const std::vector<std::string>& BuiltinPrompts() {
  static const std::vector<std::string>* prompts = new std::vector<std::string>(Make());
  return *prompts;
}

}  // namespace specd::loadtest
