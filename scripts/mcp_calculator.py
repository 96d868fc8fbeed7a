"""A calculator as an MCP server (stdio), the tool configs/grpo_tools.py takes from MCP.

    python scripts/mcp_calculator.py            # speaks MCP on stdin/stdout

One tool, `calculate(expression)`: integer and decimal arithmetic (+ - * / // % **,
parentheses, unary signs) evaluated exactly from the expression's syntax tree (no
`eval`): integers stay integers, a division is a fraction written as a decimal. Anything
else in the expression is an `isError` result that says what was not allowed, as a real
server reports a bad argument. Built with the official `mcp` SDK's server class, so the
agent sees what any MCP server sends (`pip install -e '.[mcp]'`).
"""
from __future__ import annotations

import ast
import fractions
import operator

# A power's exponent and a result's digits are bounded: `9**9**9` is a denial of service,
# not arithmetic.
MAX_EXPONENT = 1000
MAX_DIGITS = 4000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, exact; ValueError says what is wrong."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    value = _evaluate(tree.body)
    if value.denominator == 1:
        return str(value.numerator)
    return _decimal(value)


def _evaluate(node: ast.AST) -> fractions.Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return fractions.Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
            # Bounded before computing: the result's digits are about the base's times
            # the exponent.
            if _digits(left) * abs(right) > 2 * MAX_DIGITS:
                raise ValueError(f"a value has more than {MAX_DIGITS} digits")
        elif right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ValueError("division by zero")
        result = fractions.Fraction(_BINARY[type(node.op)](left, right))
        if _digits(result) > MAX_DIGITS:
            raise ValueError(f"a value has more than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** "
                     "and parentheses")


def _digits(value: fractions.Fraction) -> int:
    return max(len(str(abs(value.numerator))), len(str(value.denominator)))


def _decimal(value: fractions.Fraction, places: int = 12) -> str:
    """`value` to `places` decimals, trailing zeros dropped."""
    scaled = round(value * 10 ** places)
    sign = "-" if scaled < 0 else ""
    whole, part = divmod(abs(scaled), 10 ** places)
    return f"{sign}{whole}.{part:0{places}d}".rstrip("0").rstrip(".")


def main() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("agentjax-calculator")

    @server.tool(name="calculate", description="Evaluates an arithmetic expression "
                 "exactly: numbers, + - * / // % ** and parentheses.")
    def calculate_tool(expression: str) -> str:
        try:
            return calculate(expression)
        except ValueError as error:  # the SDK reports a ToolError's own message
            raise ToolError(str(error)) from None

    server.run("stdio")


if __name__ == "__main__":
    main()
