from quantkit.data.language import guess_language, language_shares, record_language
from quantkit.data.records import Record


def test_writing_systems_and_english():
    assert guess_language("请问我的订单什么时候发货？") == "zh"
    assert guess_language("こんにちは、注文をキャンセルしたいです") == "ja"
    assert guess_language("안녕하세요 주문 취소하고 싶어요") == "ko"
    assert guess_language("Здравствуйте, где мой заказ?") == "ru"
    assert guess_language("Where is my order? It was due on Friday and the tracking has not moved.") == "en"
    assert guess_language("Hola, quiero cancelar mi pedido. El envío llegó tarde y la caja estaba rota.") == "latin"
    assert guess_language("12345 !!!") == "unknown"


def test_code_counts_as_the_language_of_its_prose():
    code = "Write a function to find the nth hexagonal number.\nassert hexagonal_num(10) == 190\ndef hexagonal_num(n):"
    assert guess_language(code) == "en"


def test_a_tag_wins_over_the_guess():
    tagged = Record("f:1", "text", text="Where is my order and what is the delay?", lang="de")
    untagged = Record("f:2", "text", text="退款会在三到五个工作日内原路返回。")
    assert record_language(tagged) == "de" and record_language(untagged) == "zh"
    assert language_shares([tagged, untagged, untagged]) == {"zh": 2 / 3, "de": 1 / 3}
