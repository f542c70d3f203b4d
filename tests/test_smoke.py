async def test_admin_creates_action(gql, admin):
    result = await gql(admin, 'mutation { createAction(input: {name: "a"}) { actionId version } }')
    assert result.ok()["createAction"]["version"] == 1
