"""Blackjack rules, with no server: a seeded shoe, hand values with soft aces, the dealer's play, the episode.

Rules (one bet, no doubling, splitting, insurance or surrender):
- The shoe is `num_decks` 52-card decks shuffled by `random.Random(seed)`; cards are dealt player, dealer,
  player, dealer. The dealer's second card stays hidden until the player stands or busts (no peek).
- The player hits or stands. Above 21 the player busts and loses at once.
- The dealer then draws to 17 or more; on a soft 17 (an ace counted 11) the dealer stands, unless
  `dealer_hits_soft_17` (the "H17" rule of many casinos).
- A natural (two-card 21) beats any other 21; two naturals push. Otherwise the higher total wins, a dealer
  bust loses, equal totals push. Reward: win +1, push 0, loss -1 (a natural also pays +1, not 3:2).
- A reply with neither `hit` nor `stand` changes nothing but uses a turn; after `max_steps` turns with no
  end the hand is forfeited (reward -1, `truncated`).

Gymnasium's `Blackjack-v1` draws with replacement from an infinite deck and always stands on 17; this module
deals from a finite shuffled shoe and names the cards so the model can read them.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

RANKS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
SUITS = ("Spades", "Hearts", "Diamonds", "Clubs")
RANK_NAMES = {"A": "Ace", "J": "Jack", "Q": "Queen", "K": "King"}
_ACTION = re.compile(r"\b(hit|stand)\b", re.IGNORECASE)

Card = tuple[str, str]  # (rank, suit)


def card_value(card: Card) -> int:
    """Hard value of a card: ace 1, face cards 10, others their number."""
    rank = card[0]
    return 1 if rank == "A" else 10 if rank in "JQK" else int(rank)


def hand_value(cards: list[Card]) -> tuple[int, bool]:
    """(best total, soft): one ace counts 11 when that keeps the total at 21 or less (then the hand is soft).
    `[A, 6]` → (17, True); `[A, 6, 9]` → (16, False); `[A, A, 9]` → (21, True)."""
    total = sum(card_value(c) for c in cards)
    if any(c[0] == "A" for c in cards) and total + 10 <= 21:
        return total + 10, True
    return total, False


def is_natural(cards: list[Card]) -> bool:
    return len(cards) == 2 and hand_value(cards)[0] == 21


def card_name(card: Card) -> str:
    return f"{RANK_NAMES.get(card[0], card[0])} of {card[1]}"


def parse_action(text: str) -> str | None:
    """The last `hit` or `stand` in a reply (any case, whole words), else None. `I'll hit... no, STAND` → stand."""
    found = _ACTION.findall(text or "")
    return found[-1].lower() if found else None


def shuffled_shoe(seed: int, num_decks: int = 1) -> list[Card]:
    """`num_decks` decks in the order `random.Random(seed).shuffle` gives (dealt from the front)."""
    shoe = [(rank, suit) for _ in range(num_decks) for suit in SUITS for rank in RANKS]
    random.Random(seed).shuffle(shoe)
    return shoe


def dealer_plays(dealer: list[Card], shoe: list[Card], hits_soft_17: bool) -> None:
    """Draw from `shoe` into `dealer` until 17 or more (a soft 17 draws when `hits_soft_17`)."""
    while True:
        total, soft = hand_value(dealer)
        if total > 17 or (total == 17 and not (soft and hits_soft_17)):
            return
        dealer.append(shoe.pop(0))


def settle(player: list[Card], dealer: list[Card]) -> tuple[str, float]:
    """(outcome, reward) of two finished hands, the player not bust."""
    if is_natural(player) or is_natural(dealer):
        if is_natural(player) and is_natural(dealer):
            return "push", 0.0
        return ("win", 1.0) if is_natural(player) else ("loss", -1.0)
    mine, theirs = hand_value(player)[0], hand_value(dealer)[0]
    if theirs > 21 or mine > theirs:
        return "win", 1.0
    return ("push", 0.0) if mine == theirs else ("loss", -1.0)


@dataclass
class BlackjackEpisode:
    """One hand. `outcome`: None while playing, then win | push | loss | bust | forfeit."""

    shoe: list[Card]
    player: list[Card] = field(default_factory=list)
    dealer: list[Card] = field(default_factory=list)
    dealer_hits_soft_17: bool = False
    max_steps: int = 10
    turns: int = 0
    outcome: str | None = None
    total_reward: float = 0.0
    seed: int | None = None

    @classmethod
    def deal(
        cls, seed: int, *, num_decks: int = 1, dealer_hits_soft_17: bool = False, max_steps: int = 10
    ) -> BlackjackEpisode:
        shoe = shuffled_shoe(seed, num_decks)
        player, dealer = [shoe[0], shoe[2]], [shoe[1], shoe[3]]
        return cls(shoe[4:], player, dealer, dealer_hits_soft_17, max_steps, seed=seed)

    @property
    def terminated(self) -> bool:
        return self.outcome in {"win", "push", "loss", "bust"}

    @property
    def truncated(self) -> bool:
        return self.outcome == "forfeit"

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def step(self, reply: str) -> tuple[float, str]:
        """Play one model reply; returns (reward of this step, observation text)."""
        self.turns += 1
        action = parse_action(reply)
        note = ""
        if action == "hit":
            self.player.append(self.shoe.pop(0))
            note = f"You drew the {card_name(self.player[-1])}."
            if hand_value(self.player)[0] > 21:
                return self.finish("bust", -1.0, note)
        elif action == "stand":
            dealer_plays(self.dealer, self.shoe, self.dealer_hits_soft_17)
            return self.finish(*settle(self.player, self.dealer), "You stand.")
        else:
            note = "Invalid action: reply with hit or stand; this still used a turn."
        if self.turns >= self.max_steps:
            return self.finish(
                "forfeit", -1.0, f"{note} No decision after {self.max_steps} turns: the hand is forfeited."
            )
        return 0.0, self.observation(note)

    def finish(self, outcome: str, reward: float, note: str) -> tuple[float, str]:
        self.outcome = outcome
        self.total_reward += reward
        return reward, self.observation(note)

    def observation(self, note: str = "") -> str:
        """The player's hand and total, the dealer's visible cards, and what happens next."""
        player_total, soft = hand_value(self.player)
        hand = ", ".join(card_name(c) for c in self.player)
        lines = [note] if note else []
        lines.append(f"Your hand: {hand} (total {player_total}{', soft' if soft else ''}).")
        if self.outcome in {"win", "push", "loss"}:
            dealer = ", ".join(card_name(c) for c in self.dealer)
            lines.append(f"Dealer's hand: {dealer} (total {hand_value(self.dealer)[0]}).")
        else:
            lines.append(f"Dealer shows: {card_name(self.dealer[0])}.")
        verdicts = {
            "win": "You win (+1).",
            "push": "Push (0).",
            "loss": "You lose (-1).",
            "bust": "Bust: you lose (-1).",
            "forfeit": "You lose (-1).",
        }
        lines.append(verdicts.get(self.outcome or "", "Reply with hit or stand."))
        return "\n".join(lines)
