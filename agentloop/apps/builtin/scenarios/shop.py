"""Scenarios on the shop app (with the supervisor's cards and addresses)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from agentloop.apps.builtin.apps.shop import make_order, order_totals
from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios._when import day_label
from agentloop.apps.builtin.scenarios.common import days_ago, plant
from agentloop.apps.evaluation import Expect, added, contains, removed, updated
from agentloop.apps.tasks import NoInstance, OracleClient, Scenario, TaskInstance, pick
from agentloop.apps.world import World

Record = dict[str, Any]


# --- reading the initial state (setup only; oracles use the APIs) ------------------------------


def products(world: World) -> list[Record]:
    return sorted(world.state["shop"]["products"].values(), key=lambda p: p["id"])


def cart_lines(world: World) -> list[Record]:
    return sorted(world.state["shop"]["cart_items"].values(), key=lambda c: c["id"])


def orders(world: World) -> list[Record]:
    return sorted(world.state["shop"]["orders"].values(), key=lambda o: o["id"])


def product(world: World, product_id: int) -> Record:
    rec: Record = world.state["shop"]["products"][str(product_id)]
    return rec


def buyable(world: World, minimum: int = 3) -> list[Record]:
    """Products with enough stock that are not in the cart."""
    in_cart = {c["product_id"] for c in cart_lines(world)}
    return [p for p in products(world) if p["stock"] >= minimum and p["id"] not in in_cart]


def plant_order(
    world: World,
    rng: random.Random,
    items: list[Record],
    quantities: list[int],
    placed_days_ago: float,
    status: str = "delivered",
) -> Record:
    """An order on a day with no other order, so that 'my order of <day>' names it."""
    taken = {o["placed_at"][:10] for o in orders(world)}
    while days_ago(world, placed_days_ago)[:10] in taken:
        placed_days_ago += 1
    placed = datetime.fromisoformat(days_ago(world, placed_days_ago))
    delivered_at = iso(placed + timedelta(days=rng.uniform(2, 3))) if status == "delivered" else None
    order = make_order(
        items,
        quantities,
        status=status,
        placed_at=iso(placed),
        delivered_at=delivered_at,
        card_id=rng.choice(sorted(supervisor_names(world)[0])),
        address_id=rng.choice(sorted(supervisor_names(world)[1])),
    )
    return plant(world, "shop", "orders", order)


def the(name: str, start: bool = False) -> str:
    """'the OXO Blender' ('The OXO Blender' to start a sentence); book titles as they are."""
    if name.startswith("The ") or name.endswith(("(Paperback)", "(Hardcover)")):
        return name
    return f"{'The' if start else 'the'} {name}"


# --- expectations ------------------------------------------------------------------------------


def order_items(quantities: dict[int, int]) -> Callable[[Any], bool]:
    """Matcher for an order's items: exactly these product ids with these quantities."""

    def match(items: Any) -> bool:
        if not isinstance(items, list) or len(items) != len(quantities):
            return False
        return {i.get("product_id"): i.get("quantity") for i in items} == quantities

    return match


def checkout_changes(
    world: World, quantities: dict[int, int], card_id: int, address_id: int, cart_removed: list[int]
) -> list[Expect]:
    """What buying `quantities` changes: a new order, the cart items gone, less stock."""
    lines = [{"unit_price": product(world, pid)["price"], "quantity": q} for pid, q in quantities.items()]
    total = order_totals(lines)["total"]
    return [
        added(
            "shop",
            "orders",
            status="processing",
            payment_card_id=card_id,
            address_id=address_id,
            total=total,
            items=order_items(quantities),
            label=f"shop.orders added: products {sorted(quantities)}, total {total}",
        ),
        *(removed("shop", "cart_items", cid) for cid in cart_removed),
        *(updated("shop", "products", pid, stock=product(world, pid)["stock"] - q) for pid, q in quantities.items()),
    ]


# --- oracle helpers ----------------------------------------------------------------------------


def find_product(c: OracleClient, token: str, name: str) -> Record:
    return next(p for p in c.pages("shop", "search_products", access_token=token, query=name) if p["name"] == name)


def card_and_address(c: OracleClient, card_name: str, address_name: str) -> tuple[int, int]:
    cards = c.call("supervisor", "show_payment_cards")
    addresses = c.call("supervisor", "show_addresses")
    card = next(x["id"] for x in cards if x["card_name"] == card_name)
    address = next(x["id"] for x in addresses if x["name"] == address_name)
    return card, address


def supervisor_names(world: World) -> tuple[dict[int, str], dict[int, str]]:
    cards = {c["id"]: c["card_name"] for c in world.state["supervisor"]["payment_cards"].values()}
    addresses = {a["id"]: a["name"] for a in world.state["supervisor"]["addresses"].values()}
    return cards, addresses


# --- scenarios ---------------------------------------------------------------------------------


def shop_product_price(world: World, rng: random.Random) -> TaskInstance:
    target = rng.choice(products(world))
    name = target["name"]

    def oracle(c: OracleClient) -> float:
        token = c.login("shop")
        return float(find_product(c, token, name)["price"])

    question = rng.choice(["How much does {} cost on the shop?", "What is the price of {} in the shop?"])
    return TaskInstance(question.format(the(name)), oracle, answer=target["price"])


def shop_add_to_cart(world: World, rng: random.Random) -> TaskInstance:
    target = rng.choice(buyable(world))
    name, quantity = target["name"], rng.choice([1, 1, 2, 3])

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        found = find_product(c, token, name)
        c.call("shop", "add_to_cart", access_token=token, product_id=found["product_id"], quantity=quantity)

    what = the(name) if quantity == 1 else f"{quantity} of {the(name)}"
    return TaskInstance(
        f"Add {what} to my shop cart.",
        oracle,
        [added("shop", "cart_items", product_id=target["id"], quantity=quantity)],
    )


def shop_remove_from_cart(world: World, rng: random.Random) -> TaskInstance:
    line = rng.choice(cart_lines(world))
    name = product(world, line["product_id"])["name"]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        cart = c.call("shop", "show_cart", access_token=token)
        item = next(i for i in cart["items"] if i["name"] == name)
        c.call("shop", "remove_from_cart", access_token=token, cart_item_id=item["cart_item_id"])

    return TaskInstance(
        f"Take {the(name)} out of my shop cart; I don't need it anymore.",
        oracle,
        [removed("shop", "cart_items", line["id"])],
    )


REVIEWS = {
    5: ["Exactly what I hoped for, works perfectly.", "Great quality, I use it every day."],
    4: ["Good value for the price.", "Does the job well, shipping was quick."],
    2: ["Stopped working properly after a few weeks.", "Feels cheaper than it looks in the photos."],
}


def shop_review_purchase(world: World, rng: random.Random) -> TaskInstance:
    reviewed = {r["product_id"] for r in world.state["shop"]["reviews"].values()}
    received = sorted(
        {i["product_id"] for o in orders(world) if o["status"] == "delivered" for i in o["items"]} - reviewed
    )
    target = product(world, rng.choice(received))
    name, stars = target["name"], rng.choice(sorted(REVIEWS))
    text = rng.choice(REVIEWS[stars])

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        found = find_product(c, token, name)
        c.call("shop", "write_review", access_token=token, product_id=found["product_id"], rating=stars, text=text)

    return TaskInstance(
        f'Leave a {stars}-star review on the shop for {the(name)} I bought, with the text: "{text}"',
        oracle,
        [added("shop", "reviews", product_id=target["id"], rating=stars, text=text)],
    )


def shop_cancel_unshipped(world: World, rng: random.Random) -> TaskInstance:
    processing = [o for o in orders(world) if o["status"] == "processing"]
    order = rng.choice(processing)
    names_elsewhere = {i["name"] for o in processing if o is not order for i in o["items"]}
    item = rng.choice([i for i in order["items"] if i["name"] not in names_elsewhere])
    name = item["name"]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        mine = next(
            o for o in c.pages("shop", "list_orders", access_token=token, status="processing") if name in o["products"]
        )
        c.call("shop", "cancel_order", access_token=token, order_id=mine["order_id"])

    restock = [
        updated("shop", "products", i["product_id"], stock=product(world, i["product_id"])["stock"] + i["quantity"])
        for i in order["items"]
    ]
    return TaskInstance(
        f"Cancel my shop order that has {the(name)} in it; it hasn't shipped yet.",
        oracle,
        [updated("shop", "orders", order["id"], status="cancelled"), *restock],
    )


def shop_cheapest_rated(world: World, rng: random.Random) -> TaskInstance:
    in_cart = {c["product_id"] for c in cart_lines(world)}
    options, telling = [], []  # telling: the filters change the answer
    for category in sorted({p["category"] for p in products(world)}):
        shelf = sorted((p for p in products(world) if p["category"] == category), key=lambda p: p["price"])
        for stars in (4.0, 4.5):
            fits = [p for p in shelf if p["rating"] >= stars and p["stock"] > 0]
            if len(fits) >= 3 and fits[0]["price"] < fits[1]["price"] and fits[0]["id"] not in in_cart:
                options.append((category, stars, fits[0]))
                if fits[0]["id"] != shelf[0]["id"]:
                    telling.append(options[-1])
    category, stars, target = rng.choice(telling or options)

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        hits = list(
            c.pages(
                "shop",
                "search_products",
                access_token=token,
                category=category,
                min_rating=stars,
                in_stock_only=True,
                sort_by="price_low_to_high",
            )
        )
        cheapest = min(hits, key=lambda p: p["price"])
        c.call("shop", "add_to_cart", access_token=token, product_id=cheapest["product_id"], quantity=1)

    return TaskInstance(
        f"Add the cheapest product in the shop's {category} category that is in stock and rated at least "
        f"{stars:g} stars to my cart (one of it).",
        oracle,
        [added("shop", "cart_items", product_id=target["id"], quantity=1)],
    )


def shop_return_damaged(world: World, rng: random.Random) -> TaskInstance:
    picked = rng.sample(buyable(world), 2)
    order = plant_order(world, rng, picked, [1, 1], placed_days_ago=rng.uniform(7, 12))
    item = rng.choice(order["items"])
    name, placed_day = item["name"], order["placed_at"][:10]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        mine = next(
            o
            for o in c.pages("shop", "list_orders", access_token=token, status="delivered")
            if o["placed_at"].startswith(placed_day) and name in o["products"]
        )
        full = c.call("shop", "show_order", access_token=token, order_id=mine["order_id"])
        line = next(i for i in full["items"] if i["name"] == name)
        c.call(
            "shop",
            "return_item",
            access_token=token,
            order_id=mine["order_id"],
            item_id=line["item_id"],
            reason="Arrived damaged",
        )

    return TaskInstance(
        f"{the(name, start=True)} from the shop order I placed on {day_label(order['placed_at'])} arrived damaged. "
        "Return it, giving 'arrived damaged' as the reason.",
        oracle,
        [added("shop", "returns", order_id=order["id"], item_id=item["item_id"], reason=contains("damaged"))],
    )


def shop_spent_between(world: World, rng: random.Random) -> TaskInstance:
    ranges = []
    for back in range(60, 200, 3):
        first = datetime.fromisoformat(days_ago(world, back)).replace(hour=0, minute=0, second=0)
        for length in (30, 40, 50):
            last = first + timedelta(days=length)
            low, high = iso(first), iso(last + timedelta(days=1))
            counted = [o for o in orders(world) if low <= o["placed_at"] < high and o["status"] != "cancelled"]
            if len(counted) >= 2:
                ranges.append((first, last))
    first, last = rng.choice(ranges)
    low, high = iso(first), iso(last + timedelta(days=1))
    # a cancelled order in the range, so that leaving it out matters
    plant_order(world, rng, rng.sample(buyable(world), 1), [1], (world.now - first).days - 10, status="cancelled")
    total = round(
        sum(o["total"] for o in orders(world) if low <= o["placed_at"] < high and o["status"] != "cancelled"), 2
    )

    def oracle(c: OracleClient) -> float:
        token = c.login("shop")
        placed = c.pages("shop", "list_orders", access_token=token, placed_after=low, placed_before=high)
        return round(sum(o["total"] for o in placed if o["status"] != "cancelled"), 2)

    return TaskInstance(
        f"How much did my shop orders placed from {first:%B} {first.day} to {last:%B} {last.day}, {last.year} "
        "(both days included) come to in total? Leave out cancelled orders.",
        oracle,
        answer=total,
    )


def shop_checkout_cart(world: World, rng: random.Random) -> TaskInstance:
    lines = cart_lines(world)
    dropped = rng.choice(lines)
    dropped_name = product(world, dropped["product_id"])["name"]
    cards, addresses = supervisor_names(world)
    card_id, address_id = rng.choice(sorted(cards)), rng.choice(sorted(addresses))
    card_name, address_name = cards[card_id], addresses[address_id]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        cart = c.call("shop", "show_cart", access_token=token)
        line = next(i for i in cart["items"] if i["name"] == dropped_name)
        c.call("shop", "remove_from_cart", access_token=token, cart_item_id=line["cart_item_id"])
        card, address = card_and_address(c, card_name, address_name)
        c.call("shop", "checkout", access_token=token, payment_card_id=card, address_id=address)

    bought = {x["product_id"]: x["quantity"] for x in lines if x is not dropped}
    return TaskInstance(
        f"Take {the(dropped_name)} out of my shop cart and buy the rest. Pay with my {card_name} card and ship it "
        f"to my {address_name.lower()} address.",
        oracle,
        checkout_changes(world, bought, card_id, address_id, [x["id"] for x in lines]),
    )


def shop_reorder_latest(world: World, rng: random.Random) -> TaskInstance:
    picked = rng.sample(buyable(world, minimum=5), rng.randint(2, 3))
    quantities = [rng.choice([1, 1, 2]) for _ in picked]
    order = plant_order(world, rng, picked, quantities, placed_days_ago=rng.uniform(4, 4.5))
    # delivered yesterday: the latest delivery, whether one goes by order or by delivery date
    order.update(delivered_at=days_ago(world, 0.6), updated_at=days_ago(world, 0.6))
    hint = rng.choice(order["items"])["name"]
    cards, addresses = supervisor_names(world)
    card_id, address_id = rng.choice(sorted(cards)), rng.choice(sorted(addresses))
    card_name, address_name = cards[card_id], addresses[address_id]
    cart_before = [x["id"] for x in cart_lines(world)]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        latest = max(
            c.pages("shop", "list_orders", access_token=token, status="delivered"), key=lambda o: o["delivered_at"]
        )
        items = c.call("shop", "show_order", access_token=token, order_id=latest["order_id"])["items"]
        for line in c.call("shop", "show_cart", access_token=token)["items"]:
            c.call("shop", "remove_from_cart", access_token=token, cart_item_id=line["cart_item_id"])
        for item in items:
            c.call("shop", "add_to_cart", access_token=token, product_id=item["product_id"], quantity=item["quantity"])
        card, address = card_and_address(c, card_name, address_name)
        c.call("shop", "checkout", access_token=token, payment_card_id=card, address_id=address)

    return TaskInstance(
        f"Buy my most recently delivered shop order again (the one with {the(hint)}): the same products in the same "
        "quantities, and nothing else, so clear out whatever is in my cart now. "
        f"Pay with my {card_name} card and ship to my {address_name.lower()} address.",
        oracle,
        checkout_changes(
            world, {i["product_id"]: i["quantity"] for i in order["items"]}, card_id, address_id, cart_before
        ),
    )


CART_QUESTIONS = {
    "units": (
        "How many items are in my shop cart, counting every unit?",
        "How many units does my shop cart hold in all?",
    ),
    "products": ("How many different products are in my shop cart?",),
    "total": ("What would my shop cart cost in total right now, shipping included?",),
}


def shop_cart_question(world: World, rng: random.Random) -> TaskInstance:
    lines = cart_lines(world)
    if not lines:
        raise NoInstance("no items in the cart")
    kind = rng.choice(sorted(CART_QUESTIONS))

    def answer(cart: dict[str, Any]) -> float:
        if kind == "units":
            return sum(int(i["quantity"]) for i in cart["items"])
        return len(cart["items"]) if kind == "products" else float(cart["total"])

    def oracle(c: OracleClient) -> float:
        token = c.login("shop")
        return answer(c.call("shop", "show_cart", access_token=token))

    priced = [{"unit_price": product(world, x["product_id"])["price"], "quantity": x["quantity"]} for x in lines]
    expected = answer({"items": priced, **order_totals(priced)})
    return TaskInstance(rng.choice(CART_QUESTIONS[kind]), oracle, answer=expected)


def shop_drop_by_price(world: World, rng: random.Random) -> TaskInstance:
    lines = cart_lines(world)
    prices = sorted((product(world, x["product_id"])["price"], x["id"]) for x in lines)
    if len(prices) < 2 or prices[-1][0] == prices[-2][0] or prices[0][0] == prices[1][0]:
        raise NoInstance("no cart with one cheapest and one most expensive product")
    highest = rng.random() < 0.5
    dropped = prices[-1][1] if highest else prices[0][1]

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        items = c.call("shop", "show_cart", access_token=token)["items"]
        pick_one = max if highest else min
        line = pick_one(items, key=lambda i: i["unit_price"])
        c.call("shop", "remove_from_cart", access_token=token, cart_item_id=line["cart_item_id"])

    which = rng.choice(["highest", "most expensive"] if highest else ["lowest", "cheapest"])
    what = f"the product with the {which} unit price" if which in ("highest", "lowest") else f"the {which} product"
    return TaskInstance(f"Remove {what} from my shop cart.", oracle, [removed("shop", "cart_items", dropped)])


def shop_buy_with_cart(world: World, rng: random.Random) -> TaskInstance:
    target = pick(rng, buyable(world), "product in stock outside the cart")
    name = target["name"]
    cards, addresses = supervisor_names(world)
    card_id, address_id = rng.choice(sorted(cards)), rng.choice(sorted(addresses))
    card_name, address_name = cards[card_id], addresses[address_id]
    lines = cart_lines(world)

    def oracle(c: OracleClient) -> None:
        token = c.login("shop")
        found = find_product(c, token, name)
        c.call("shop", "add_to_cart", access_token=token, product_id=found["product_id"], quantity=1)
        card, address = card_and_address(c, card_name, address_name)
        c.call("shop", "checkout", access_token=token, payment_card_id=card, address_id=address)

    bought = {x["product_id"]: x["quantity"] for x in lines} | {target["id"]: 1}
    return TaskInstance(
        f"Add {the(name)} to my shop cart and check out the whole cart. Pay with my {card_name} card and ship it "
        f"to my {address_name.lower()} address.",
        oracle,
        checkout_changes(world, bought, card_id, address_id, [x["id"] for x in lines]),
    )


SCENARIOS = [
    Scenario("shop_product_price", 1, ("shop",), "train", shop_product_price),
    Scenario("shop_add_to_cart", 1, ("shop",), "train", shop_add_to_cart),
    Scenario("shop_remove_from_cart", 1, ("shop",), "dev", shop_remove_from_cart),
    Scenario("shop_review_purchase", 1, ("shop",), "train", shop_review_purchase),
    Scenario("shop_cart_question", 1, ("shop",), "train", shop_cart_question),
    Scenario("shop_drop_by_price", 1, ("shop",), "train", shop_drop_by_price),
    Scenario("shop_buy_with_cart", 2, ("shop",), "train", shop_buy_with_cart),
    Scenario("shop_cancel_unshipped", 2, ("shop",), "train", shop_cancel_unshipped),
    Scenario("shop_return_damaged", 2, ("shop",), "train", shop_return_damaged),
    Scenario("shop_checkout_cart", 2, ("shop",), "dev", shop_checkout_cart),
    Scenario("shop_cheapest_rated", 2, ("shop",), "test_normal", shop_cheapest_rated),
    Scenario("shop_spent_between", 2, ("shop",), "test_normal", shop_spent_between),
    Scenario("shop_reorder_latest", 3, ("shop",), "test_normal", shop_reorder_latest),
]
