"""Training prompts that quote a passage or a program: summarise it, rewrite it, copy it, answer
from it, translate it, explain or edit the code.

Serving traffic quotes text (retrieval, editing, summaries: half of the loadtest's built-in
prompts), and a draft trained only on short questions is accepted far less there (0.33 against
0.52 at k 1, docs/PERFORMANCE.md). The passages are generated here from sentence templates and
slot lists, so thousands of them differ in their names, numbers and order of facts; the draft
has to learn to copy from its context, not to remember a few texts.

Nothing here may appear in a held-out set: the tool's evaluation subjects and the loadtest's
passage and program are kept out (checked by `passage_prompts`' caller and by distill_test).
"""
import random

NAMES = ["Ayşe Demir", "Mehmet Kaya", "Elif Şahin", "Can Yılmaz", "Zeynep Arslan", "Anna Berg",
         "Lukas Hoffmann", "Sofia Rossi", "Marco Bianchi", "Claire Martin", "Hugo Laurent",
         "Lucía García", "Pablo Ortega", "James Carter", "Emily Walsh", "Noah Fischer",
         "Ingrid Dahl", "Olga Petrova", "Kenji Sato", "Priya Nair", "Samuel Okafor",
         "Fatma Koç", "Emre Aydın", "Hannah Weber", "Oliver Grant"]
TOWNS = ["Kestrel Bay", "Millbrook", "Aydınlık", "Söğütlü", "Nordhavn", "Valmont", "Brightwater",
         "Oakridge", "San Lorenzo", "Karaağaç", "Linden", "Ferrowick", "Eskiköy", "Port Ellis",
         "Greyfield", "Montsalve", "Yeşilova", "Haldor", "Riverton", "Castelbruno"]
CITIES = ["Ankara", "Izmir", "Vienna", "Lyon", "Porto", "Leeds", "Gothenburg", "Bologna",
          "Kraków", "Valencia", "Hamburg", "Bursa", "Edinburgh", "Seville", "Tampere"]
BUILDINGS = ["old railway station", "stone mill", "customs house", "town library",
             "covered market", "clock tower", "textile factory", "harbour warehouse",
             "village school", "brewery", "post office", "observatory"]
USES = ["a grain store", "a boarding school", "a printing works", "a hospital", "a bakery",
        "a telegraph office", "a workshop for boat builders", "a cinema", "a soap factory"]
MATERIALS = ["red brick", "oak beams", "local limestone", "iron and glass", "reinforced concrete"]
TODAY = ["a local history museum", "a public library", "a concert hall", "artists' studios",
         "a café and a bookshop", "a craft market", "a youth centre"]
EXHIBITS = ["the original steam engine", "old photographs of the harbour", "a working loom",
            "the founder's letters", "a model of the town in 1900", "hand-drawn maps"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
FIELDS = ["chemistry", "architecture", "music", "medicine", "engineering", "law", "botany",
          "economics", "painting", "mathematics"]
JOBS = ["baker", "night watchman", "translator", "taxi driver", "waiter", "printer's assistant"]
WORKS = ["novel", "book of poems", "album", "textbook", "collection of short stories"]
PRIZES = ["Golden Quill Award", "National Science Medal", "Harbour Prize", "City Arts Prize"]
ORGS = ["a choir for young people", "a small publishing house", "a school for the deaf",
        "a cycling club", "a seed library", "an orchestra of amateur musicians"]
EVENTS = ["book fair", "summer concert", "harvest festival", "charity run", "science day",
          "film night", "street market"]
VENUES = ["the town square", "the old harbour", "Linden Park", "the sports hall",
          "the community centre", "the school yard"]
STREETS = ["Mill Road", "Station Street", "Atatürk Caddesi", "Harbour Lane", "Church Street",
           "Bahçe Sokak", "Market Square"]
ANIMALS = ["red squirrels", "honeyeaters", "field mice", "river otters", "crows", "hedgehogs",
           "sea turtles", "mountain goats", "bumblebees", "tree frogs"]
HABITATS = ["city parks", "coastal dunes", "pine forests", "farmland", "river deltas",
            "mountain meadows"]
BEHAVIOURS = ["store food", "call to each other", "leave their nests", "travel at night",
              "gather in large groups"]
CONDITIONS = ["nights are warmer than usual", "there is more traffic noise",
              "the first frost comes early", "streetlights stay on all night",
              "rainfall drops below normal"]
CAUSES = ["changes in the food supply", "artificial light", "the shorter winters",
          "new predators in the area"]
SECTORS = ["software", "bicycle", "kitchen appliance", "solar heating", "shipping", "toy"]
PRODUCTS = ["route planner", "electric cargo bike", "coffee grinder", "weather station",
            "language-learning app", "smart thermostat"]
FEATURES = ["start-up", "charging", "searching", "syncing", "printing", "navigation"]
DISHES = ["lentil soup", "a lemon cake", "stuffed peppers", "a vegetable curry",
          "mercimek köftesi", "a tomato sauce", "oat biscuits"]
INGREDIENTS = ["onion", "red lentils", "flour", "butter", "rice", "tomato paste", "sugar",
               "bulgur", "cumin", "grated carrot"]


def _values(rng):
    """One passage's names and numbers: every sentence of a passage uses the same ones."""
    year = rng.randint(1780, 1990)
    name = rng.choice(NAMES)
    values = dict(
        name=name, last=name.split()[-1], name2=rng.choice([n for n in NAMES if n != name]),
        town=rng.choice(TOWNS), town2=rng.choice(TOWNS), city=rng.choice(CITIES),
        city2=rng.choice(CITIES), building=rng.choice(BUILDINGS), use=rng.choice(USES),
        material=rng.choice(MATERIALS), today=rng.choice(TODAY), exhibit=rng.choice(EXHIBITS),
        weekday=rng.choice(WEEKDAYS), month=rng.choice(MONTHS), field=rng.choice(FIELDS),
        job=rng.choice(JOBS), work=rng.choice(WORKS), prize=rng.choice(PRIZES),
        org=rng.choice(ORGS), event=rng.choice(EVENTS), venue=rng.choice(VENUES),
        venue2=rng.choice(VENUES), street=rng.choice(STREETS), street2=rng.choice(STREETS),
        animal=rng.choice(ANIMALS), habitat=rng.choice(HABITATS),
        behaviour=rng.choice(BEHAVIOURS), condition=rng.choice(CONDITIONS),
        cause=rng.choice(CAUSES), sector=rng.choice(SECTORS), product=rng.choice(PRODUCTS),
        feature=rng.choice(FEATURES), dish=rng.choice(DISHES),
        ingredient=rng.choice(INGREDIENTS), ingredient2=rng.choice(INGREDIENTS),
        year=year, year2=year + rng.randint(5, 40), year3=year + rng.randint(41, 80),
        day=rng.randint(1, 28), n=rng.randint(3, 90), n2=rng.randint(100, 900),
        n3=rng.randint(2, 30), pct=rng.randint(5, 80), price=rng.randint(3, 60),
        age=rng.randint(15, 25), age2=rng.randint(60, 97), hour=rng.randint(8, 19))
    return values


# Each kind is a sequence of sentences in a sensible order; a passage keeps its first and 3-5 of
# the rest, in order.
PASSAGE_KINDS = [
    [  # a building's history
        "The {building} in {town} was built in {year} by {name}, a merchant from {town2}.",
        "For {n} years it served as {use}, and at its busiest it employed {n2} people.",
        "In {year2} a fire destroyed the roof, which was rebuilt in {material} two years later.",
        "The town council bought the building in {year3} for {n2} thousand pounds.",
        "Today it houses {today}, open every day except {weekday}.",
        "Visitors can see {exhibit}, and guided tours start at {hour} o'clock.",
    ],
    [  # a life
        "{name} was born in {town} in {year} and grew up on a small farm.",
        "At {age} {last} moved to {city} to study {field}, working nights as a {job}.",
        "{last}'s first {work} appeared in {year2} and sold {n2} copies in its first year.",
        "Later {last} founded {org}, which now has {n2} members in {n3} countries.",
        "In {year3} {last} received the {prize} together with {name2}.",
        "{last} died in {town2} at the age of {age2}.",
    ],
    [  # a notice
        "The friends of {town} will hold their annual {event} on {weekday} {day} {month} at "
        "{venue}.",
        "Doors open at {hour}:00 and the programme starts half an hour later.",
        "Tickets cost {price} euros for adults; children under {age} enter free.",
        "Because of roadworks on {street}, visitors are asked to park on {street2}.",
        "Anyone who wants to help should write to the organiser, {name}, before {day} {month}.",
        "If it rains, the {event} moves to {venue2}.",
    ],
    [  # a study
        "Researchers in {city} have watched {animal} living in {habitat} for {n} years.",
        "They found that the animals {behaviour} far more often when {condition}.",
        "In a group of {n2} animals, {pct} percent changed their behaviour within {n3} days.",
        "The team, led by {name}, thinks the change is linked to {cause}.",
        "Other scientists warn that the study covered only {n3} sites.",
        "The results were published in {month} {year3}.",
    ],
    [  # a company's news
        "{name} runs a {sector} company in {city} that has released a new {product}.",
        "The new version makes {feature} {pct} percent faster and costs {price} euros less.",
        "Customers who bought the old model before {day} {month} can upgrade for free.",
        "The company sold {n2} units last year, up from {n} the year before.",
        "It plans to open an office in {city2} and to hire {n3} engineers by the end of the "
        "year.",
    ],
    [  # a recipe
        "To make {dish} for {n3} people, start by preparing the {ingredient}.",
        "Fry it in a little oil for {n3} minutes, until it is soft but not brown.",
        "Then add {n2} grams of {ingredient2} and stir for another {n3} minutes.",
        "Pour in a litre of water, add salt, and let it simmer for {n} minutes.",
        "Taste it before serving; a squeeze of lemon makes it fresher.",
        "It keeps for {n3} days in the fridge.",
    ],
    [  # Turkish: a building's history
        "{town} kasabasındaki eski değirmen {year} yılında {name} tarafından yaptırıldı.",
        "Değirmen {n} yıl boyunca çalıştı ve en yoğun döneminde {n2} kişiye iş verdi.",
        "{year2} yılında çıkan bir yangında çatısı yandı, iki yıl sonra yeniden yapıldı.",
        "Belediye binayı {year3} yılında satın aldı.",
        "Bugün binada bir müze var ve müze {weekday} hariç her gün açık.",
        "Rehberli turlar saat {hour}:00'da başlıyor.",
    ],
]

PASSAGE_TASKS = [
    "Summarize this passage in one sentence:\n\n{p}",
    "Give a short summary of the text below.\n\n{p}",
    "Rewrite this passage for a ten-year-old, keeping all the facts.\n\n{p}",
    "Copy the text below word for word.\n\n{p}",
    "Turn the following passage into a bulleted list of facts.\n\n{p}",
    "Write a title for this passage, then explain its main point.\n\n{p}",
    "List every number in the text below and say what it refers to.\n\n{p}",
    "Using only the passage below, say who is mentioned and what each of them did.\n\n{p}",
    "Translate this passage into Turkish.\n\n{p}",
    "Bu metni iki cümleyle özetle.\n\n{p}",
    "Make the following text more formal and return all of it.\n\n{p}",
    "Write three questions that can be answered from this passage, with their answers.\n\n{p}",
    "Read the passage and tell me the most surprising fact in it.\n\n{p}",
    "Split the following text into one sentence per line.\n\n{p}",
    "{p}\n\nWhat is this text about?",
    "{p}\n\nRewrite the text above in the past tense where it is not already.",
]

# Programs with {f} (a function name) and {v} (a variable) to vary; tasks may rename {v} to {w}.
PROGRAMS = [
    "def {f}(values):\n    {v} = 0\n    for x in values:\n        if x > 0:\n"
    "            {v} += x\n    return {v}\n",
    "def {f}(text):\n    {v} = {{}}\n    for word in text.split():\n"
    "        {v}[word] = {v}.get(word, 0) + 1\n    return {v}\n",
    "function {f}(items) {{\n  const {v} = [];\n  for (const item of items) {{\n"
    "    if (!{v}.includes(item)) {v}.push(item);\n  }}\n  return {v};\n}}\n",
    "int {f}(const int *a, int n) {{\n  int {v} = a[0];\n  for (int i = 1; i < n; i++)\n"
    "    if (a[i] > {v}) {v} = a[i];\n  return {v};\n}}\n",
    "def {f}(path):\n    {v} = []\n    with open(path) as fh:\n        for line in fh:\n"
    "            if line.strip():\n                {v}.append(line.rstrip())\n    return {v}\n",
    "def {f}(n):\n    {v} = [True] * (n + 1)\n    for i in range(2, int(n ** 0.5) + 1):\n"
    "        for j in range(i * i, n + 1, i):\n            {v}[j] = False\n"
    "    return [i for i in range(2, n + 1) if {v}[i]]\n",
    "class {F}:\n    def __init__(self):\n        self.{v} = []\n\n    def add(self, item):\n"
    "        self.{v}.append(item)\n\n    def size(self):\n        return len(self.{v})\n",
]
FUNC_NAMES = ["sum_positive", "count_words", "unique_items", "largest", "read_lines",
              "primes_up_to", "collect", "process", "tally", "scan"]
VAR_NAMES = ["total", "result", "acc", "counts", "seen", "best", "lines", "flags", "items"]
CODE_TASKS = [
    "Explain what this code does.\n\n{c}",
    "Add comments to this code and return the complete code.\n\n{c}",
    "Rewrite this code in Python if it is not Python, otherwise in JavaScript.\n\n{c}",
    "Write a unit test for this code.\n\n{c}",
    "Is there a bug in this code? Explain briefly.\n\n{c}",
    "Rename {v} to {w} everywhere in this code and return the whole code.\n\n{c}",
    "Bu kod ne yapıyor? Kısaca açıkla.\n\n{c}",
    "{c}\nWhat does the function above return for an empty input?",
]


def _passage(rng):
    kind = rng.choice(PASSAGE_KINDS)
    # The first sentence introduces the subject; 3-5 of the rest follow it.
    keep = [0] + sorted(rng.sample(range(1, len(kind)), rng.randint(3, len(kind) - 1)))
    values = _values(rng)
    return " ".join(kind[i].format(**values) for i in keep)


def _program_prompt(rng):
    f = rng.choice(FUNC_NAMES)
    v, w = rng.sample(VAR_NAMES, 2)
    code = rng.choice(PROGRAMS).format(f=f, F=f.title().replace("_", ""), v=v)
    return rng.choice(CODE_TASKS).format(c=code, v=v, w=w)


def passage_prompts(n, rng, code_share=0.2):
    """n distinct prompts: about code_share of them hand a program over, the rest a passage."""
    out, seen = [], set()
    while len(out) < n:
        if rng.random() < code_share:
            p = _program_prompt(rng)
        else:
            p = rng.choice(PASSAGE_TASKS).format(p=_passage(rng))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
