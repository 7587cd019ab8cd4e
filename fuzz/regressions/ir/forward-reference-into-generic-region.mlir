%a = "sage.dequant"(%b) : (!sage.tile) -> !sage.tile
"sage.attention"() ({
  %b = "sage.input"() {role = #sage<role q>} : () -> !sage.tile
  garbage
})
