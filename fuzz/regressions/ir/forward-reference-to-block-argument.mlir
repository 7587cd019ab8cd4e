%a = "sage.dequant"(%b) : (!sage.tile) -> !sage.tile
"sage.attention"() ({
^bb0(%b: !sage.tile):
  garbage
})
