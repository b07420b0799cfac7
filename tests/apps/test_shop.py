"""The shop app: catalogue search, cart, checkout, orders, returns and reviews, as an agent calls them."""

from typing import Any

import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.evaluation import StateEvaluator
from agentloop.apps.tasks import OracleClient, run_oracle
from agentloop.apps.world import World


class Shop:
    """A logged-in shop session on a fresh world."""

    def __init__(self, seed: int = 11) -> None:
        self.world: World = BUILTIN.new_world(seed, ["shop"])
        profile = self.world.state["supervisor"]["profile"]["1"]
        password = self.world.state["supervisor"]["accounts"]["shop"]["password"]
        self.token = self.world.call("shop", "login", {"username": profile["email"], "password": password})[
            "access_token"
        ]

    def __call__(self, api: str, **args: Any) -> Any:
        return self.world.call("shop", api, {"access_token": self.token, **args})

    def table(self, name: str) -> dict[str, dict[str, Any]]:
        return self.world.state["shop"][name]

    def orders(self, status: str) -> list[dict[str, Any]]:
        return sorted((o for o in self.table("orders").values() if o["status"] == status), key=lambda o: o["id"])


@pytest.fixture
def shop() -> Shop:
    return Shop()


def error(call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as exc:
        call(*args, **kwargs)
    return exc.value


def test_every_api_but_login_needs_a_token(shop: Shop) -> None:
    for api in ("search_products", "show_cart", "list_orders"):
        err = error(shop.world.call, "shop", api, {"access_token": "forged"})
        assert err.status == 401 and "shop.login" in err.message


def test_search_pages_cover_the_catalogue_without_overlap_and_end(shop: Shop) -> None:
    seen: list[int] = []
    for page in range(100):
        items = shop("search_products", page_index=page, page_limit=20)
        if not items:
            break
        seen += [p["product_id"] for p in items]
    assert 80 <= len(seen) <= 150
    assert sorted(seen) == sorted(int(k) for k in shop.table("products"))


def test_search_filters_and_sorting(shop: Shop) -> None:
    cheap_first = shop("search_products", category="home & kitchen", sort_by="price_low_to_high", page_limit=20)
    prices = [p["price"] for p in cheap_first]
    assert prices == sorted(prices) and {p["category"] for p in cheap_first} == {"Home & Kitchen"}

    rated = shop("search_products", min_rating=4.5, in_stock_only=True, max_price=60, page_limit=20)
    assert rated and all(p["rating"] >= 4.5 and p["in_stock"] and p["price"] <= 60 for p in rated)

    some = next(iter(shop.table("products").values()))
    words = some["name"].lower().split()
    hits = shop("search_products", query=" ".join(reversed(words)), page_limit=20)
    assert some["id"] in [p["product_id"] for p in hits]
    assert all(all(w in f"{p['name']} {p['brand']} {p['category']}".lower() for w in words) for p in hits)
    mats = shop("search_products", query="yoga mats", page_limit=20)
    assert mats and all("yoga mat" in p["name"].lower() for p in mats)


def test_search_rejects_unknown_category_and_inverted_price_range(shop: Shop) -> None:
    err = error(shop, "search_products", category="Spaceships")
    assert err.status == 404 and "Electronics" in err.message
    err = error(shop, "search_products", min_price=50, max_price=10)
    assert err.status == 422 and "min_price" in err.message
    assert error(shop, "search_products", page_limit=21).status == 422


def test_categories_count_the_catalogue(shop: Shop) -> None:
    categories = shop("list_categories")
    assert sum(c["product_count"] for c in categories) == len(shop.table("products"))
    assert 8 <= len(categories) <= 20


def in_stock_not_in_cart(shop: Shop, minimum: int = 4, maximum: int = 100) -> dict[str, Any]:
    in_cart = {c["product_id"] for c in shop.table("cart_items").values()}
    return next(
        p for p in shop.table("products").values() if minimum <= p["stock"] <= maximum and p["id"] not in in_cart
    )


def test_add_to_cart_merges_lines_and_respects_stock(shop: Shop) -> None:
    product = in_stock_not_in_cart(shop, maximum=20)
    first = shop("add_to_cart", product_id=product["id"])
    again = shop("add_to_cart", product_id=product["id"], quantity=2)
    assert again["cart_item_id"] == first["cart_item_id"] and again["quantity"] == 3
    err = error(shop, "add_to_cart", product_id=product["id"], quantity=product["stock"])
    assert err.status == 409 and f"Only {product['stock']}" in err.message
    sold_out = next(p for p in shop.table("products").values() if p["stock"] == 0)
    assert error(shop, "add_to_cart", product_id=sold_out["id"]).status == 409
    assert error(shop, "add_to_cart", product_id=99999).status == 404


def test_cart_totals_charge_shipping_below_35_dollars(shop: Shop) -> None:
    for line in list(shop.table("cart_items").values()):
        shop("remove_from_cart", cart_item_id=line["id"])
    assert shop("show_cart")["total"] == 0
    cheap = next(p for p in shop.table("products").values() if 0 < p["price"] < 30 and p["stock"] > 0)
    shop("add_to_cart", product_id=cheap["id"])
    cart = shop("show_cart")
    assert cart["subtotal"] == cheap["price"] and cart["shipping"] == 5.99
    assert cart["total"] == round(cheap["price"] + 5.99, 2)


def test_removed_cart_item_ids_are_never_reused(shop: Shop) -> None:
    last = max(int(k) for k in shop.table("cart_items"))
    shop("remove_from_cart", cart_item_id=last)
    line = shop("add_to_cart", product_id=in_stock_not_in_cart(shop)["id"])
    assert line["cart_item_id"] == last + 1
    assert error(shop, "remove_from_cart", cart_item_id=last).status == 404
    assert error(shop, "update_cart_item", cart_item_id=last, quantity=1).status == 404


def test_checkout_places_order_empties_cart_and_lowers_stock(shop: Shop) -> None:
    cart = shop("show_cart")
    stock = {i["product_id"]: shop.table("products")[str(i["product_id"])]["stock"] for i in cart["items"]}
    placed = shop("checkout", payment_card_id=2, address_id=1)
    order = shop("show_order", order_id=placed["order_id"])
    assert order["status"] == "processing" and order["total"] == cart["total"] == placed["total"]
    assert {i["product_id"]: i["quantity"] for i in order["items"]} == {
        i["product_id"]: i["quantity"] for i in cart["items"]
    }
    for item in cart["items"]:
        assert shop.table("products")[str(item["product_id"])]["stock"] == stock[item["product_id"]] - item["quantity"]
    assert shop("show_cart")["items"] == []
    assert shop("list_orders", page_limit=1)[0]["order_id"] == placed["order_id"]  # newest first
    err = error(shop, "checkout", payment_card_id=2, address_id=1)
    assert err.status == 409 and "empty" in err.message


def test_checkout_errors_name_what_to_fix(shop: Shop) -> None:
    err = error(shop, "checkout", payment_card_id=9, address_id=1)
    assert err.status == 404 and "supervisor.show_payment_cards" in err.message
    err = error(shop, "checkout", payment_card_id=1, address_id=9)
    assert err.status == 404 and "supervisor.show_addresses" in err.message
    shop.world.state["supervisor"]["payment_cards"]["1"]["expiry_date"] = "01/24"
    err = error(shop, "checkout", payment_card_id=1, address_id=1)
    assert err.status == 422 and "expired" in err.message
    assert shop.table("cart_items")  # nothing bought


def test_list_orders_filters_and_pages(shop: Shop) -> None:
    paged = [o["order_id"] for p in range(10) for o in shop("list_orders", page_index=p, page_limit=4)]
    assert sorted(paged) == sorted(int(k) for k in shop.table("orders"))  # no overlap, nothing missed
    placed_at = [shop.table("orders")[str(i)]["placed_at"] for i in paged]
    assert placed_at == sorted(placed_at, reverse=True)
    delivered = shop("list_orders", status="delivered", page_limit=20)
    assert delivered and {o["status"] for o in delivered} == {"delivered"}
    placed = sorted(o["placed_at"] for o in shop.table("orders").values())
    middle = placed[len(placed) // 2]
    later = shop("list_orders", placed_after=middle, page_limit=20)
    earlier = shop("list_orders", placed_before=middle, page_limit=20)
    assert len(later) + len(earlier) == len(placed) and all(o["placed_at"] >= middle for o in later)
    err = error(shop, "list_orders", placed_after="last tuesday")
    assert err.status == 422 and "ISO 8601" in err.message


def test_cancel_only_unshipped_orders_and_restock(shop: Shop) -> None:
    order = shop.orders("processing")[0]
    stock = {i["product_id"]: shop.table("products")[str(i["product_id"])]["stock"] for i in order["items"]}
    assert shop("cancel_order", order_id=order["id"])["status"] == "cancelled"
    for item in order["items"]:
        assert shop.table("products")[str(item["product_id"])]["stock"] == stock[item["product_id"]] + item["quantity"]
    assert error(shop, "cancel_order", order_id=order["id"]).status == 409
    shipped = shop.orders("shipped")[0]
    err = error(shop, "cancel_order", order_id=shipped["id"])
    assert err.status == 409 and "return its items" in err.message


def test_returns_need_a_delivered_order_within_30_days(shop: Shop) -> None:
    now = shop.world.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    recent = [o for o in shop.orders("delivered") if shop("show_order", order_id=o["id"])["return_window_ends"] > now]
    old = [o for o in shop.orders("delivered") if o not in recent]
    order = recent[0]
    item = order["items"][0]
    done = shop("return_item", order_id=order["id"], item_id=item["item_id"], reason="Too small")
    assert done["refund_amount"] == round(item["unit_price"] * item["quantity"], 2)
    shown = shop("show_order", order_id=order["id"])["items"][0]
    assert shown["return_status"] == "requested"
    assert error(shop, "return_item", order_id=order["id"], item_id=item["item_id"], reason="again").status == 409
    assert error(shop, "return_item", order_id=order["id"], item_id=42, reason="x").status == 404
    err = error(shop, "return_item", order_id=old[0]["id"], item_id=1, reason="late")
    assert err.status == 409 and "closed" in err.message
    shipped = shop.orders("shipped")[0]
    assert error(shop, "return_item", order_id=shipped["id"], item_id=1, reason="x").status == 409


def test_reviews_only_for_received_products_once(shop: Shop) -> None:
    reviewed = {r["product_id"] for r in shop.table("reviews").values()}
    received = {i["product_id"] for o in shop.orders("delivered") for i in o["items"]} - reviewed
    never = next(
        p
        for p in shop.table("products").values()
        if not any(i["product_id"] == p["id"] for o in shop.table("orders").values() for i in o["items"])
    )
    assert error(shop, "write_review", product_id=never["id"], rating=5, text="great").status == 403
    pid = min(received)
    shop("write_review", product_id=pid, rating=2, text="Broke quickly.")
    assert shop("show_product", product_id=pid)["your_review"] == {"rating": 2, "text": "Broke quickly."}
    assert error(shop, "write_review", product_id=pid, rating=4, text="again").status == 409
    assert error(shop, "write_review", product_id=pid, rating=6, text="x").status == 422


def test_checkout_task_fails_with_the_wrong_card() -> None:
    task = BUILTIN.task("shop_checkout_cart-1")
    world = BUILTIN.task_world(task.id)
    before = world.copy_state()
    client = OracleClient(world)
    token = client.login("shop")
    cart = client.call("shop", "show_cart", access_token=token)
    dropped = next(i for i in cart["items"] if i["name"] in task.instruction)
    client.call("shop", "remove_from_cart", access_token=token, cart_item_id=dropped["cart_item_id"])
    right_card = 2 if "Visa Travel" in task.instruction else 1
    client.call("shop", "checkout", access_token=token, payment_card_id=3 - right_card, address_id=1)
    verdict = StateEvaluator(task.evaluator.expectations, volatile=task.evaluator.volatile).evaluate(
        before, world.state, None
    )
    assert not verdict.success and 0 < verdict.reward < 1

    world = BUILTIN.task_world(task.id)
    before = world.copy_state()
    run_oracle(task, world)
    assert task.evaluator.evaluate(before, world.state, world.answer).success
